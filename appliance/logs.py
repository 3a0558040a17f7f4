"""Logging: structlog, one event per line, JSON by default, readable on a terminal.

Every record, including those of libraries using the stdlib `logging` module (boto3,
moto's HTTP server), goes through the same processor chain, so secrets are redacted
everywhere: any key that looks like a credential has its value replaced, and so do
credential-looking values inside free text (an Authorization header in a message).
"""
from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog

REDACTED = "[REDACTED]"
_SECRET_KEY = re.compile(r"secret|token|password|passwd|authorization|credential|access_key|api_key|"
                         r"signature", re.IGNORECASE)
# credentials inside free text: an Authorization header (to the end of the value), key=value
# pairs such as token=..., and presigned-URL signatures
_SECRET_IN_TEXT = (
    re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*)[^\"'\n]+"),
    re.compile(r"(?i)((?:x-amz-security-token|x-amz-signature|signature|secret[_-]?(?:access[_-]?)?key|"
               r"session[_-]?token|token|password)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}&]+"),
)
_QUIET_LIBRARIES = ("botocore", "boto3", "urllib3", "s3transfer", "werkzeug", "moto", "asyncio")


def _redact_value(key: str, value: Any) -> Any:
    if isinstance(key, str) and _SECRET_KEY.search(key):
        return REDACTED if value not in (None, "") else value
    if isinstance(value, dict):
        return {k: _redact_value(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_value("", v) for v in value)
    if isinstance(value, str):
        for pattern in _SECRET_IN_TEXT:
            value = pattern.sub(lambda m: m.group(1) + REDACTED, value)
        return value
    return value


def redact_secrets(_logger, _method, event_dict: dict) -> dict:
    """structlog processor: credentials and tokens never reach the output."""
    return {k: _redact_value(k, v) for k, v in event_dict.items()}


def _shared_processors() -> list:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        redact_secrets,
    ]


def configure(fmt: str = "auto", level: str = "info", stream=None) -> None:
    """Set up structlog and the stdlib root logger. fmt: "json" | "console" | "auto"
    (console when the stream is a TTY)."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if getattr(stream, "isatty", lambda: False)() else "json"
    renderer = (structlog.dev.ConsoleRenderer(colors=False) if fmt == "console"
                else structlog.processors.JSONRenderer(sort_keys=False))
    numeric = getattr(logging, level.upper())
    shared = _shared_processors()
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in _QUIET_LIBRARIES:        # their INFO/DEBUG chatter is per request: keep it out
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
