"""Logging: structlog, one event per line, JSON by default, readable on a terminal.

Every record, including those of libraries using the stdlib `logging` module (boto3,
moto's HTTP server), goes through the same processor chain, so secrets are redacted
everywhere: any key that looks like a credential has its value replaced, and so do
credential-looking values inside free text (an Authorization header in a message).

When stderr is connected to the journal (systemd sets $JOURNAL_STREAM to its "device:inode"),
each line starts with a syslog priority prefix, "<3>" for an error, "<4>" a warning, "<6>"
info, "<7>" debug (sd-daemon(3)); journald strips it and files the line under that PRIORITY,
so `journalctl -u ckptgw -p err` shows the errors only. Elsewhere (a terminal, a file, a pipe)
lines are left as they are.
"""
from __future__ import annotations

import functools
import logging
import os
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
# a word every pattern of _SECRET_IN_TEXT needs: a string without one is not searched further
_SECRET_WORD = re.compile(r"authorization|signature|secret|token|password", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _is_secret_key(key: str) -> bool:
    """Event keys are few and repeat: each is searched once."""
    return _SECRET_KEY.search(key) is not None


def _redact_value(key: str, value: Any) -> Any:
    if isinstance(key, str) and _is_secret_key(key):
        return REDACTED if value not in (None, "") else value
    if isinstance(value, dict):
        return {k: _redact_value(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_value("", v) for v in value)
    if isinstance(value, str):
        if _SECRET_WORD.search(value):
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


# syslog priorities (sd-daemon(3) prefixes) of the stdlib levels
_PRIORITY = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def syslog_priority(levelno: int) -> int:
    for threshold, priority in _PRIORITY:
        if levelno >= threshold:
            return priority
    return 7


def stream_is_journal(stream) -> bool:
    """True when `stream` is the journal's stdout/stderr socket ($JOURNAL_STREAM names it)."""
    want = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = want.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


class _BoundLogger(structlog.stdlib.BoundLogger):
    """A call below the stdlib logger's level returns before the processor chain (about
    3 us a call through it, for every disabled debug line of every request). The level
    is the stdlib logger's, so a reload that changes it takes effect for loggers already
    cached too."""

    def debug(self, event=None, *args, **kw):
        if self._logger.isEnabledFor(logging.DEBUG):
            return super().debug(event, *args, **kw)
        return None

    def info(self, event=None, *args, **kw):
        if self._logger.isEnabledFor(logging.INFO):
            return super().info(event, *args, **kw)
        return None


class _JournalHandler(logging.StreamHandler):
    """A StreamHandler whose lines carry the "<N>" priority prefix journald reads."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{syslog_priority(record.levelno)}>{super().format(record)}"


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
        wrapper_class=_BoundLogger,
        cache_logger_on_first_use=True,
    )
    # No caller lookup (a walk up the stack) for every record: no line shows file or line
    # numbers (the logging HOWTO's "Optimization" section names this switch).
    logging._srcfile = None
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = (_JournalHandler if stream_is_journal(stream) else logging.StreamHandler)(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in _QUIET_LIBRARIES:        # their INFO/DEBUG chatter is per request: keep it out
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
