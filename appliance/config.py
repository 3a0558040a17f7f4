"""The appliance configuration: one TOML file -> typed, frozen dataclasses.

Every scalar option is declared once, as a dataclass field whose metadata says how to
parse it (`_opt`). The same declaration drives the TOML loader, the `serve` command-line
flags (`flag_options()`), and the error messages. A wrong file raises ConfigError naming
the file, the LINE, the key and what was expected; tomllib gives no line numbers for
keys, so `_LineIndex` finds them with a light scan of the TOML text.

Flags: options of [server] are `--KEY` (`--listen`, `--cache-dir`), every other table's
are `--TABLE-KEY` (`--s3-bucket`, `--metrics-listen`, `--upload-settle`); exports are
given with the repeatable `--export PATH[:NETWORKS[:rw|ro[:SQUASH[:secure|insecure]]]]`.
"""
from __future__ import annotations

import difflib
import grp
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, ClassVar

from uploader.settings import UploadSettings as _UploadSettings

from .units import fmt_seconds, parse_duration, parse_size

_UP = {f.name: f.default for f in fields(_UploadSettings)}

DEFAULT_CONFIG_PATH = "/etc/ckptgw/config.toml"
SERVICE_ADMIN_SOCKET = "/run/ckptgw/admin.sock"
NFS_PORT = 2049
UNPRIVILEGED_NFS_PORT = 12049


class ConfigError(ValueError):
    """A configuration problem, located: `where` is "FILE:LINE" or "--flag". A file with
    several problems raises one ConfigError naming them all (`errors`, one line each);
    where/key/expected are the first one's."""

    def __init__(self, where: str | None, key: str, expected: str):
        self.where, self.key, self.expected = where, key, expected
        self.errors: list[ConfigError] = [self]
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{key}: {expected}")

    @classmethod
    def combine(cls, errors: list["ConfigError"]) -> "ConfigError":
        if len(errors) == 1:
            return errors[0]
        first = errors[0]
        out = cls(first.where, first.key, first.expected)
        out.errors = list(errors)
        out.args = (f"{len(errors)} problems:\n" + "\n".join(f"  {e}" for e in errors),)
        return out


# ---- value kinds -------------------------------------------------------------------
# A parser takes the raw TOML (or flag text) value and returns the typed value or raises
# ValueError("expected ..."). Flags arrive as strings; `from_text` says how to read them.

def _kind(metavar: str):
    """Mark a parser with the placeholder `serve --help` shows for its flags."""
    def mark(fn):
        fn.metavar = metavar
        return fn
    return mark


def _describe(v: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(v), type(v).__name__)
    return f"{kind} ({v!r})" if isinstance(v, (bool, int, float, str)) else kind


@_kind("true|false")
def _bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return v.lower() in ("true", "yes", "on", "1")
    raise ValueError(f"expected true or false, got {_describe(v)}")


@_kind("TEXT")
def _str(v):
    if isinstance(v, str):
        return v
    raise ValueError(f"expected a string, got {_describe(v)}")


@_kind("TEXT")
def _opt_str(v):
    """A string; "" means unset (None)."""
    return _str(v) or None


def _int(lo=None, hi=None):
    def parse(v):
        if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected an integer, got {_describe(v)}")
        if lo is not None and v < lo or hi is not None and v > hi:
            raise ValueError(f"expected an integer in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
        return v
    parse.metavar = "INTEGER"
    return parse


def _float(lo=None, hi=None):
    def parse(v):
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                pass
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"expected a number, got {_describe(v)}")
        if lo is not None and v < lo or hi is not None and v > hi:
            raise ValueError(f"expected a number in [{lo}, {hi}], got {v}")
        return float(v)
    parse.metavar = "NUMBER"
    return parse


@_kind("SIZE")
def _size(v):
    """Bytes: an integer or a string with a unit ("8MiB", "500GB")."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    if isinstance(v, str):
        try:
            return parse_size(v)
        except ValueError:
            pass
    raise ValueError(f'expected a size such as 8388608 or "8MiB" or "500GB", got {_describe(v)}')


@_kind("auto|SIZE")
def _opt_size(v):
    """A size, or "auto" (None: decided at start)."""
    if v == "auto":
        return None
    try:
        return _size(v)
    except ValueError:
        raise ValueError(f'expected "auto" or a size such as "500GiB", got {_describe(v)}') from None


@_kind("DURATION")
def _duration(v):
    """Seconds: a number or a string with a unit ("500ms", "90s", "5m", "2h", "30d")."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
        return float(v)
    if isinstance(v, str):
        try:
            return parse_duration(v)
        except ValueError:
            pass
    raise ValueError(f'expected a duration such as 30 or "500ms", "90s", "5m", "2h", "30d", got {_describe(v)}')


@_kind("DURATION|never")
def _opt_duration(v):
    """A duration, or "" / "never" for none."""
    if v in ("", "never"):
        return None
    return _duration(v)


def _choice(*choices):
    def parse(v):
        if v in choices:
            return v
        raise ValueError(f"expected one of {', '.join(repr(c) for c in choices)}, got {_describe(v)}")
    parse.choices = choices             # `serve --help` lists them; click checks a flag against them
    return parse


@_kind("HOST:PORT")
def _address(v):
    """'HOST:PORT' or '[v6]:PORT' -> (host, port); '' -> None."""
    v = _str(v)
    if not v:
        return None
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d+)|([^:\s]+):(\d+)", v)
    if not m:
        raise ValueError(f'expected "HOST:PORT" such as "127.0.0.1:9464", got {v!r}')
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"expected a port in [0, 65535], got {port}")
    return (host, int(port))


@_kind("OCTAL")
def _mode(v):
    """File mode as an octal string ("0600") or integer."""
    if isinstance(v, str) and re.fullmatch(r"0?[0-7]{3}", v):
        return int(v, 8)
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 0o777:
        return v
    raise ValueError(f'expected an octal file mode such as "0600" or "0660", got {_describe(v)}')


@_kind("OCTAL")
def _dir_mode(v):
    """A directory's permission bits, sticky/setgid included ("0775", "1777"); "" for unset."""
    if v == "":
        return None
    if isinstance(v, str) and re.fullmatch(r"[0-7]{3,4}", v):
        return int(v, 8)
    raise ValueError(f'expected "" or an octal mode such as "0775" or "1777", got {_describe(v)}')


@_kind("UID:GID")
def _owner(v):
    """ "UID:GID" (numbers: names differ between clients and the gateway); "" for unset."""
    v = _str(v)
    if not v:
        return None
    m = re.fullmatch(r"(\d+):(\d+)", v)
    if not m or int(m.group(1)) >= 2**32 or int(m.group(2)) >= 2**32:
        raise ValueError(f'expected "" or numeric "UID:GID" such as "1000:1000", got {v!r}')
    return (int(m.group(1)), int(m.group(2)))


@_kind("GROUP")
def _group(v):
    """A group name or gid that exists on this host; "" for none."""
    v = _str(v) if not isinstance(v, int) or isinstance(v, bool) else str(v)
    if not v:
        return None
    try:
        (grp.getgrgid(int(v)) if v.isdigit() else grp.getgrnam(v))
    except (KeyError, OverflowError):
        raise ValueError(f"expected an existing group name or gid, got {v!r}") from None
    return v


@_kind("CIDR[,CIDR...]")
def _networks(v):
    if isinstance(v, str):
        v = [s for s in v.split(",") if s.strip()]
    if not isinstance(v, list) or not v:
        raise ValueError(f'expected a non-empty array of networks such as ["10.0.0.0/8", "127.0.0.1"], got {_describe(v)}')
    out = []
    for item in v:
        try:
            out.append(str(ipaddress.ip_network(_str(item).strip(), strict=False)))
        except ValueError:
            raise ValueError(f"expected networks in CIDR form such as \"10.0.0.0/8\", got {item!r}") from None
    return tuple(out)


@_kind("PATH")
def _export_path(v):
    v = _str(v)
    if not v.startswith("/") or "//" in v or any(p in (".", "..") for p in v.split("/")):
        raise ValueError(f'expected an absolute pseudo-filesystem path such as "/checkpoints", got {v!r}')
    return v.rstrip("/") or "/"


@_kind("URL")
def _s3_endpoint(v):
    v = _str(v)
    if v and not re.match(r"^https?://[^/\s]+", v):
        raise ValueError(f'expected "" (embedded try-out S3) or a URL such as "https://s3.example.com", got {v!r}')
    return v or None


@_kind("BUCKET")
def _bucket(v):
    v = _str(v)
    if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", v):
        raise ValueError(f"expected an S3 bucket name (3-63 of a-z 0-9 . -), got {v!r}")
    return v


@_kind("PREFIX")
def _prefix(v):
    v = _str(v)
    if v.startswith("/"):
        raise ValueError(f"expected a key prefix not starting with '/', got {v!r}")
    return v


def _storage_class(v):
    return _choice("STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR",
                   "GLACIER", "DEEP_ARCHIVE")(v)


# What a reload does with a changed option (its `reload` in the declaration; a section's
# `reload_default` when the option names none). The daemon has one applier per effect
# (appliance.daemon.RELOAD_APPLIERS); "restart" means: reported as needing a restart, the
# running value is kept.
RELOAD_EFFECTS = {
    "restart": "needs a restart",
    "config": "read from the configuration each time it is used: applied at once",
    "log": "the log format and level are set again",
    "exports": "the exports are rebuilt and swapped in (clients stay connected)",
    "watermarks": "the store's eviction watermarks are set again",
    "eviction": "the uploader's evictor uses it from its next round",
}


def _opt(default, parse: Callable, doc: str, *, example: str | None = None, required: bool = False,
         reload: str | None = None, to: str | None = None, metavar: str | None = None):
    """Declare one option: its default, its parser, the comment that documents it, what a
    reload does when it changes (a RELOAD_EFFECTS key; None: the section's reload_default), and
    `to`, the name of the library setting it feeds when that differs (uploader.settings), and
    `metavar`, its flag's placeholder in `serve --help` when the parser's (`_kind`) says too little."""
    assert reload is None or reload in RELOAD_EFFECTS, reload
    return field(default=default, metadata={"parse": parse, "doc": doc, "example": example,
                                            "required": required, "reload": reload, "to": to,
                                            "metavar": metavar or getattr(parse, "metavar", "VALUE")})


def _default_cache_dir() -> str:
    """./ckptgw-data; under systemd <StateDirectory>/cache instead ($STATE_DIRECTORY, set by the unit's
    StateDirectory=ckptgw: /var/lib/ckptgw/cache), an absolute path ProtectSystem=strict leaves writable."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return os.path.join(state, "cache") if os.path.isabs(state) else "./ckptgw-data"


# ---- the sections ---------------------------------------------------------------------

@dataclass(frozen=True)
class ServerSettings:
    reload_default: ClassVar[str] = "restart"
    listen: tuple | None = _opt(None, _address, "NFS listen address. Default 127.0.0.1:2049 when run as root "
                                "(or with CAP_NET_BIND_SERVICE under systemd), else 127.0.0.1:12049. "
                                'Clients on other hosts need e.g. "0.0.0.0:2049".', example='""')
    cache_dir: str = _opt(_default_cache_dir(), _str, "Local cache (extent store + LMDB index). Put it on NVMe. "
                          "Default ./ckptgw-data, or $STATE_DIRECTORY/cache under systemd (/var/lib/ckptgw/cache).",
                          metavar="PATH")
    capacity: int | None = _opt(None, _opt_size, '"auto" (filesystem size less reserve) or a size: the most '
                                'the cache may hold.', example='"auto"')
    reserve: int = _opt(1 << 30, _size, "Space left free on the cache filesystem when capacity is auto.")
    high_watermark: float = _opt(0.90, _float(0.0, 1.0), "Start evicting clean files above this fraction of "
                                 "capacity.", reload="watermarks")
    low_watermark: float = _opt(0.80, _float(0.0, 1.0), "Evict down to this fraction of capacity.",
                                reload="watermarks")
    evict_interval: float = _opt(_UP["evict_interval"], _duration, "How often the watermarks are checked.",
                                 reload="eviction")
    lease_time: float = _opt(90.0, _duration, "NFSv4 lease time: clients silent longer lose their state.")
    grace_time: float | None = _opt(None, _opt_duration, "Grace period after a start in which clients that "
                                    "held opens and locks reclaim them and other new state waits (RFC 8881 "
                                    "8.4). Empty: the lease time. Ends early once every such NFSv4.1 client "
                                    "has sent RECLAIM_COMPLETE; there is none when no client held state.",
                                    example='""')
    owner_domain: str | None = _opt(None, _opt_str, 'NFSv4 id-mapping domain. Empty: owners travel as numeric '
                                    "ids (what Linux sends with id mapping off). Set (e.g. \"example.org\"): "
                                    "owners are sent as name@domain from this host's users and groups, and both "
                                    "forms are accepted.", example='""', reload="exports")
    shutdown_timeout: float = _opt(30.0, _duration, "On SIGTERM, how long in-flight requests and durable "
                                   "writes may take before exit.", reload="config")


def _token_name(v):
    """A token's name: shown in logs and denials in place of the secret."""
    v = _str(v)
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", v):
        raise ValueError(f"expected 1-64 letters, digits, '_' or '-', got {v!r}")
    return v


@dataclass(frozen=True)
class AdminToken:
    """One TCP admin token and what it may do (appliance.scopes); its secret from exactly one of
    token_file, token_env or token."""
    reload_default: ClassVar[str] = "restart"
    name: str = _opt(None, _token_name, "Name of the token, logged with each request and denial (never "
                     "the secret).", example='"training-jobs"', required=True)
    scope: str = _opt(None, _choice("read", "flush", "admin"), '"read": status, ls, verify, plans; "flush": '
                      'also flush and warmup; "admin": everything (reload, evict, pin, retention apply...).',
                      example='"flush"', required=True)
    token_file: str | None = _opt(None, _opt_str, "Read the secret from this file (first line).",
                                  example='"/etc/ckptgw/flush.token"', metavar="PATH")
    token_env: str | None = _opt(None, _opt_str, "Or read it from this environment variable (e.g. set by "
                                 "the unit's EnvironmentFile).", example='""', metavar="NAME")
    token: str | None = _opt(None, _opt_str, "Or the secret itself (keep the file 0640).", example='""',
                             metavar="TOKEN")


@dataclass(frozen=True)
class AdminSettings:
    reload_default: ClassVar[str] = "restart"
    socket: str | None = _opt(None, _opt_str, "Admin API Unix socket. Default <cache_dir>/admin.sock, or "
                              "/run/ckptgw/admin.sock when run by systemd.", example='""',
                              metavar="PATH")
    socket_mode: int = _opt(0o600, _mode, "Permissions of the admin socket (0660 with `group`).", example='"0600"')
    group: str | None = _opt(None, _group, "Members of this group may use the admin socket (besides the daemon's "
                             "user and root).", example='""')
    listen: tuple | None = _opt(None, _address, "Admin API over TCP (JSON lines). Off unless set; needs a token "
                                "(`token`, `token_file` or [[admin.tokens]]).",
                                example='""')
    token: str | None = _opt(None, _opt_str, "A TCP admin token of scope \"admin\" (may do everything); "
                             "[[admin.tokens]] declares scoped ones.", example='""', metavar="TOKEN")
    token_file: str | None = _opt(None, _opt_str, "Read that token from this file instead (first line).",
                                  example='""', metavar="PATH")
    tokens: tuple = field(default=(), metadata={"doc": "[[admin.tokens]]: TCP admin tokens, each with a "
                                                "name and a scope", "table_array": AdminToken})


@dataclass(frozen=True)
class MetricsSettings:
    reload_default: ClassVar[str] = "restart"
    listen: tuple | None = _opt(None, _address, 'Prometheus metrics HTTP endpoint (/metrics), e.g. '
                                '"127.0.0.1:9464". Off unless set.', example='""')


@_kind("PATH")
def _drbd_device(v):
    """/dev/drbdN, or "" for none (a single gateway)."""
    path = _str(v)
    if not path:
        return None
    from .pair import minor_of
    minor_of(path)                     # ValueError: not a DRBD device
    return path


@dataclass(frozen=True)
class PairSettings:
    reload_default: ClassVar[str] = "config"
    drbd_device: str | None = _opt(None, _drbd_device, "The DRBD device the cache volume lives on when this "
                                   "gateway is one of an HA pair (e.g. \"/dev/drbd0\"): `ckptgw status`, the "
                                   "ckptgw_pair_* metrics and the CkptgwPairDegraded alert then show whether "
                                   "the peer is connected and in sync. \"\": a single gateway.", example='""')


@dataclass(frozen=True)
class LogSettings:
    reload_default: ClassVar[str] = "log"
    format: str = _opt("auto", _choice("auto", "json", "console"), '"json" lines, "console" (readable), '
                       'or "auto": console when stderr is a terminal, else json.')
    level: str = _opt("info", _choice("debug", "info", "warning", "error"), "Least severe level logged.")


@dataclass(frozen=True)
class S3Config:
    reload_default: ClassVar[str] = "restart"
    endpoint: str | None = _opt(None, _s3_endpoint, 'S3 endpoint URL. "" starts the embedded in-memory S3 '
                                '(moto) on loopback: a TRY-OUT mode, data in it is lost at exit.', example='""',
                                to="endpoint_url")
    bucket: str = _opt("ckptgw", _bucket, "Bucket the checkpoints go to.")
    prefix: str = _opt("", _prefix, 'Prepended verbatim to every key ("ckpt/" -> "ckpt/run1/step10.pt").')
    region: str = _opt("us-east-1", _str, "Region for request signing.")
    addressing_style: str = _opt("auto", _choice("auto", "path", "virtual"), "Bucket addressing in URLs.")
    access_key: str | None = _opt(None, _opt_str, "Static credentials; empty: boto3's chain (env, "
                                  "~/.aws, instance profile).", example='""')
    secret_key: str | None = _opt(None, _opt_str, "Secret for access_key (never logged).", example='""')
    session_token: str | None = _opt(None, _opt_str, "STS session token, if any (never logged).", example='""')
    checksum_algorithm: str = _opt("CRC32", _choice("CRC32", "SHA256"), "Object checksum sent with uploads.")
    connect_timeout: float = _opt(10.0, _duration, "S3 connect timeout.")
    read_timeout: float = _opt(60.0, _duration, "S3 read timeout.")


@dataclass(frozen=True)
class UploadConfig:
    reload_default: ClassVar[str] = "restart"
    # defaults are the uploader's own (uploader.settings.UploadSettings): one source of truth
    settle: float = _opt(_UP["settle_seconds"], _duration,
                         "Quiet time after a file's last close before it is uploaded.", to="settle_seconds")
    part_size: int = _opt(_UP["part_size_min"], _size,
                          "Multipart part size floor (raised for huge files; S3 needs >= 5MiB).",
                          to="part_size_min")
    multipart_threshold: int = _opt(_UP["multipart_threshold"], _size,
                                    "Files of at least this size go up as multipart uploads.")
    max_concurrency: int = _opt(_UP["max_concurrency"], _int(1, 1024),
                                "Ceiling of the adaptive (AIMD) request concurrency.")
    min_concurrency: int = _opt(_UP["min_concurrency"], _int(1, 1024), "Floor of the adaptive request concurrency.")
    foreground_concurrency: int = _opt(_UP["foreground_concurrency"], _int(0, 1024),
                                       "Requests in flight while NFS clients save or read (lifted by a "
                                       "flush or half-full dirty data); 0 = no such ceiling.")
    requests_per_second: float = _opt(_UP["requests_per_second"], _float(0.0),
                                      "Token bucket on S3 requests; 0 = unlimited.")
    bytes_per_second: int = _opt(int(_UP["bytes_per_second"]), _size,
                                 'Token bucket on uploaded bytes ("200MB" per second); 0 = unlimited.')
    burst: float = _opt(_UP["burst_seconds"], _duration, "Token bucket depth, as seconds of rate.",
                        to="burst_seconds")
    backoff_base: float = _opt(_UP["backoff_base"], _duration,
                               "First retry delay (exponential backoff with full jitter).")
    backoff_max: float = _opt(_UP["backoff_max"], _duration, "Longest retry delay.")
    poll_interval: float = _opt(_UP["poll_interval"], _duration, "How often newly eligible files are looked for.")
    readahead_chunk: int = _opt(_UP["readahead_chunk"], _size, "Read-through fetch size and alignment.")
    readahead_chunks: int = _opt(_UP["readahead_chunks"], _int(0, 64), "Chunks fetched ahead for sequential readers.")
    abort_orphan_uploads: bool = _opt(_UP["abort_orphan_uploads"], _bool, "At start, abort multipart uploads "
                                      "under the prefix that no file refers to.")


@dataclass(frozen=True)
class ExportSettings:
    reload_default: ClassVar[str] = "exports"
    path: str = _opt("/checkpoints", _export_path, "Path clients mount (gateway:/checkpoints).")
    networks: tuple = _opt(("127.0.0.0/8", "::1/128"), _networks, "Client networks allowed (CIDR). The "
                           "default admits loopback only.", example='["127.0.0.0/8", "::1/128"]')
    access: str = _opt("rw", _choice("rw", "ro"), "Read-write or read-only.")
    squash: str = _opt("root", _choice("none", "root", "all"), '"root": uid 0 becomes anon_uid; "all": '
                       'everyone does; "none": trust client uids.')
    anon_uid: int = _opt(65534, _int(0, 2**32 - 1), "uid squashed requests run as.")
    anon_gid: int = _opt(65534, _int(0, 2**32 - 1), "gid squashed requests run as.")
    secure: bool = _opt(True, _bool, "Require AUTH_SYS clients to use a source port < 1024, as knfsd's "
                        "`secure` (others get AUTH_TOOWEAK). false = `insecure`: needed by nfs-rs "
                        "(noresvport) and other user-space clients.")
    owner: tuple | None = _opt(None, _owner, 'Owner of the export\'s root directory, "UID:GID", set at start and '
                               'on reload ("": leave it). A squashed root cannot chown it over NFS: set it here.',
                               example='""')
    mode: int | None = _opt(None, _dir_mode, 'Permissions of the export\'s root directory, e.g. "0775" or "1777" '
                            '(like /tmp), set at start and on reload ("": leave it).', example='""')


@dataclass(frozen=True)
class Transition:
    reload_default: ClassVar[str] = "config"
    after: float = _opt(None, _duration, "Age of an object at which it moves.", example='"30d"', required=True)
    storage_class: str = _opt(None, _storage_class, "S3 storage class it moves to.", example='"GLACIER_IR"',
                              required=True)


def _series_name(v):
    """A series name: it becomes an S3 tag value and part of lifecycle rule IDs."""
    from uploader.objectlock import SERIES_NAME
    v = _str(v)
    if not SERIES_NAME.fullmatch(v):
        raise ValueError(f"expected 1-64 letters, digits, '.', '_' or '-' (it becomes an S3 tag value), got {v!r}")
    return v


def _series_pattern(v):
    """An export-relative path pattern: `*` one component, `{step}` the step number's digits."""
    from uploader.series import PatternError, parse_pattern
    try:
        parse_pattern(_str(v))
    except PatternError as e:
        raise ValueError(str(e)) from None
    return "/".join(parse_pattern(v).components)


@dataclass(frozen=True)
class SeriesRule:
    """A checkpoint series: which paths belong to it and how long its steps live."""
    reload_default: ClassVar[str] = "config"
    name: str = _opt(None, _series_name, "Name of the series (in plans, logs, S3 tags and lifecycle "
                     "rule IDs).", example='"llama-70b"', required=True)
    pattern: str = _opt(None, _series_pattern, 'Export-relative path of each checkpoint DIRECTORY: "*" '
                        'matches one path component, "{step}" the step number\'s digits; a name must match '
                        'whole ("step_000900.tmp" is not "step_{step}").', example='"runs/*/step_{step}"',
                        required=True)
    keep_last: int = _opt(3, _int(0), "Keep the newest N complete checkpoints.")
    keep_every: int = _opt(0, _int(0), "Also keep every checkpoint whose step is a multiple of N (0: none).")
    min_age: float = _opt(3600.0, _duration, "Touch nothing younger than this.")
    expire_after: float | None = _opt(None, _opt_duration, 'Delete checkpoints no rule keeps once older '
                                      'than this ("never": no expiry).', example='"30d"')
    stale_tmp_after: float | None = _opt(86400.0, _opt_duration, "Delete temporary files and directories of "
                                         "an unfinished save (*.tmp, .tmp*) under the series older than "
                                         'this ("never": keep them).', example='"1d"')
    transitions: tuple = field(default=(), metadata={"doc": "Storage class moves by age: "
                               '[{after = "30d", storage_class = "GLACIER_IR"}]', "table_array": Transition,
                               "example": "[]"})


@dataclass(frozen=True)
class RetentionSettings:
    reload_default: ClassVar[str] = "config"
    pin_lock: str = _opt("legal-hold", _choice("legal-hold", "governance", "compliance", "off"),
                         "How a pin protects objects in a bucket with Object Lock: a legal hold (lifted by "
                         "unpin), a GOVERNANCE or COMPLIANCE retention of pin_lock_days, or off.")
    pin_lock_days: int = _opt(0, _int(0, 36500), "Retention days for pin_lock = governance | compliance.")
    schedule: float | None = _opt(None, _opt_duration, 'Apply the retention plan by itself this often '
                                  '("never": only `ckptgw retention apply`).', example='"never"')
    abort_incomplete_multipart_days: int = _opt(7, _int(1, 3650), "Bucket lifecycle: abort multipart uploads "
                                                "left incomplete this many days (always written by "
                                                "`ckptgw lifecycle sync`).")
    series: tuple = field(default=(), metadata={"doc": "[[retention.series]] rules", "table_array": SeriesRule})


@dataclass(frozen=True)
class Config:
    server: ServerSettings = ServerSettings()
    admin: AdminSettings = AdminSettings()
    metrics: MetricsSettings = MetricsSettings()
    log: LogSettings = LogSettings()
    s3: S3Config = S3Config()
    upload: UploadConfig = UploadConfig()
    exports: tuple = (ExportSettings(),)
    retention: RetentionSettings = RetentionSettings()
    pair: PairSettings = PairSettings()
    source: str | None = None            # the file it came from (None: defaults + flags)

    # -- derived values ------------------------------------------------------------
    @property
    def embedded_s3(self) -> bool:
        return self.s3.endpoint is None

    def listen_address(self) -> tuple[str, int]:
        if self.server.listen:
            return self.server.listen
        return ("127.0.0.1", NFS_PORT if _may_bind_low_ports() else UNPRIVILEGED_NFS_PORT)

    def admin_socket_path(self) -> str:
        if self.admin.socket:
            return self.admin.socket
        if os.environ.get("NOTIFY_SOCKET") and os.environ.get("INVOCATION_ID"):
            return SERVICE_ADMIN_SOCKET          # started by systemd: RuntimeDirectory=ckptgw
        return os.path.join(self.server.cache_dir, "admin.sock")

    def admin_tokens(self) -> tuple:
        """Every TCP admin token with its secret read (appliance.scopes.Token): admin.token /
        token_file as "admin.token" of scope admin, then [[admin.tokens]]. Raises ValueError
        naming the token whose secret is missing, empty or shared with another."""
        from .scopes import Token
        out = []
        legacy = self.admin_token()
        if legacy:
            out.append(Token("admin.token", "admin", legacy))
        elif self.admin.token_file:
            raise ValueError(f"admin.token_file {self.admin.token_file} has no token on its first line")
        for t in self.admin.tokens:
            where = f"[[admin.tokens]] {t.name!r}"
            if t.token:
                secret = t.token
            elif t.token_file:
                try:
                    with open(t.token_file, encoding="utf-8") as f:
                        secret = f.readline().strip()
                except (OSError, UnicodeDecodeError) as e:
                    raise ValueError(f"{where}: cannot read {t.token_file}: "
                                     f"{getattr(e, 'strerror', None) or e}") from None
            else:
                secret = os.environ.get(t.token_env or "", "").strip()
            if not secret:
                source = "token" if t.token else (t.token_file or f"${t.token_env}")
                raise ValueError(f"{where}: no secret in {source}")
            out.append(Token(t.name, t.scope, secret))
        for i, a in enumerate(out):
            for b in out[:i]:
                if a.secret == b.secret:
                    raise ValueError(f"admin tokens {b.name!r} and {a.name!r} have the same secret: "
                                     "the scope of a request would be ambiguous")
        return tuple(out)

    def admin_token_info(self) -> list[dict]:
        """The TCP admin tokens as `status` shows them, in admin_tokens()'s order: name, scope and
        where the secret comes from ("file PATH", "env NAME" or "config"); never the secret."""
        out = []
        if self.admin.token or self.admin.token_file:
            out.append({"name": "admin.token", "scope": "admin",
                        "secret_from": "config" if self.admin.token else f"file {self.admin.token_file}"})
        for t in self.admin.tokens:
            out.append({"name": t.name, "scope": t.scope,
                        "secret_from": "config" if t.token else (f"file {t.token_file}" if t.token_file
                                                                 else f"env {t.token_env}")})
        return out

    def admin_token(self) -> str | None:
        if self.admin.token:
            return self.admin.token
        if self.admin.token_file:
            with open(self.admin.token_file, encoding="utf-8") as f:
                return f.readline().strip() or None
        return None

    def s3_settings(self, endpoint: str | None = None, credentials: tuple | None = None):
        """uploader.settings.S3Settings for this config (endpoint/credentials of the embedded S3)."""
        from uploader.settings import S3Settings
        kwargs = _library_kwargs(self.s3)
        if endpoint:
            kwargs["endpoint_url"] = endpoint
        if credentials:
            kwargs["access_key"], kwargs["secret_key"], kwargs["session_token"] = credentials
        return S3Settings(**kwargs)

    def upload_settings(self):
        """uploader.settings.UploadSettings: every [upload] option under its declared name there."""
        from uploader.settings import UploadSettings
        kwargs = _library_kwargs(self.upload)
        kwargs.update(bytes_per_second=float(self.upload.bytes_per_second),
                      evict_interval=self.server.evict_interval)
        return UploadSettings(**kwargs)


def _library_kwargs(section) -> dict:
    """A section's options under the names of the library settings they feed (`to`)."""
    return {f.metadata["to"] or f.name: getattr(section, f.name) for f in fields(section)}


SECTIONS = {"server": ServerSettings, "admin": AdminSettings, "metrics": MetricsSettings,
            "log": LogSettings, "s3": S3Config, "upload": UploadConfig, "pair": PairSettings}


def _may_bind_low_ports() -> bool:
    if os.geteuid() == 0:
        return True
    try:      # CAP_NET_BIND_SERVICE (bit 10) in the effective set, e.g. from systemd AmbientCapabilities
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 10))
    except OSError:
        pass
    return False


# ---- locating keys in the TOML text -------------------------------------------------

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEYLINE = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")


def _split_key(text: str) -> list[str]:
    return [p.strip().strip("\"'") for p in re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", text)]


class _LineIndex:
    """Line numbers of tables and keys, by resolved path: ("exports", 0, "path")."""

    def __init__(self, text: str):
        self.lines: dict[tuple, int] = {}
        arrays: dict[tuple, int] = {}
        table: tuple = ()
        in_multiline: str | None = None
        for lineno, line in enumerate(text.splitlines(), 1):
            if in_multiline:                     # inside a ''' or """ string: no keys here
                if line.count(in_multiline) % 2 == 1:
                    in_multiline = None
                continue
            m = _HEADER.match(line)
            if m and not _KEYLINE.match(line):
                parts = _split_key(m.group(2))
                resolved: tuple = ()
                for part in parts[:-1]:
                    resolved += (part,)
                    if resolved in arrays:
                        resolved += (arrays[resolved] - 1,)
                resolved += (parts[-1],)
                if m.group(1) == "[[":
                    arrays[resolved] = arrays.get(resolved, 0) + 1
                    resolved += (arrays[resolved] - 1,)
                table = resolved
                self.lines.setdefault(table, lineno)
                continue
            m = _KEYLINE.match(line)
            if m:
                path = table + tuple(_split_key(m.group(1)))
                for i in range(len(table) + 1, len(path)):      # dotted keys define their tables
                    self.lines.setdefault(path[:i], lineno)
                self.lines.setdefault(path, lineno)
                rest = line[m.end():]
                for q in ('"""', "'''"):
                    if rest.count(q) % 2 == 1:
                        in_multiline = q

    def line_of(self, path: tuple) -> int | None:
        """The key's own line, else its nearest enclosing table's."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def _dotted(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# ---- the loader ----------------------------------------------------------------------

class _Source:
    """Where values came from, to word errors: file lines, or command-line flags."""

    def __init__(self, filename: str | None, text: str | None, flags: dict[tuple, str]):
        self.filename = filename
        self.index = _LineIndex(text) if text is not None else None
        self.flags = flags          # path -> flag name, for values given on the command line
        self.errors: list[ConfigError] = []
        self.bad: set[tuple] = set()    # paths of the problems noted: their values are not to be trusted

    def where(self, path: tuple) -> str | None:
        if path in self.flags:
            return self.flags[path]
        if self.index is not None:
            line = self.index.line_of(path)
            return f"{self.filename}:{line}" if line else self.filename
        return None

    def error(self, path: tuple, expected: str) -> ConfigError:
        where = self.where(path)
        key = _dotted(path)
        if where and where.startswith("--"):
            key = f"{key} ({where})"
            where = None
        return ConfigError(where, key, expected)

    def add(self, path: tuple, expected: str) -> None:
        """Note a problem and go on, so one run reports every problem of the file."""
        self.errors.append(self.error(path, expected))
        self.bad.add(path)

    def ok(self, *paths: tuple) -> bool:
        """No problem was noted at, above or below any of these paths: a rule across keys may judge
        their values (a value in error holds its default, and a rule would report that instead)."""
        return not any(b[:len(p)] == p or p[:len(b)] == b for p in paths for b in self.bad)

    def raise_if_any(self) -> None:
        """Raise every noted problem in one ConfigError, in the file's line order."""
        def line(e: ConfigError) -> int:
            tail = (e.where or "").rpartition(":")[2]
            return int(tail) if tail.isdigit() else 0
        if self.errors:
            raise ConfigError.combine(sorted(self.errors, key=line))


def _unknown_key(src: _Source, path: tuple, known: list[str]) -> ConfigError:
    hint = difflib.get_close_matches(str(path[-1]), known, n=1)
    expected = "unknown key" + (f" (did you mean {hint[0]!r}?)" if hint
                                else f"; expected one of: {', '.join(known)}")
    return src.error(path, expected)


def _build(cls, raw: Any, path: tuple, src: _Source):
    """The section from its raw table; problems go to src.errors (a value in error keeps its
    default here, and load() raises them all once every section is read)."""
    if not isinstance(raw, dict):
        src.add(path, f"expected a table, got {_describe(raw)}")
        return cls()
    known = [f.name for f in fields(cls)]
    for key in raw:
        if key not in known:
            src.errors.append(_unknown_key(src, path + (key,), known))
    values = {}
    for f in fields(cls):
        meta = f.metadata
        if f.name not in raw:
            if meta.get("required"):
                src.add(path + (f.name,), "required key is missing")
            continue
        value = raw[f.name]
        if "table_array" in meta:
            if not isinstance(value, list):
                src.add(path + (f.name,), f"expected an array of tables, got {_describe(value)}")
                continue
            values[f.name] = tuple(_build(meta["table_array"], item, path + (f.name, i), src)
                                   for i, item in enumerate(value))
            continue
        try:
            values[f.name] = meta["parse"](value)
        except ValueError as e:
            src.add(path + (f.name,), str(e))
    return cls(**values)


def _check(cfg: Config, src: _Source) -> None:
    """Rules across keys. They run even when some keys failed to parse, so one run names every
    problem; a rule is skipped only when one of its own keys already has a problem (`src.ok`)."""
    s = cfg.server
    if src.ok(("server", "low_watermark")) and s.low_watermark <= 0:
        src.add(("server", "low_watermark"), f"expected above 0, got {s.low_watermark}")
    elif src.ok(("server", "low_watermark"), ("server", "high_watermark")) \
            and not s.low_watermark < s.high_watermark:
        src.add(("server", "low_watermark"),
                f"expected below high_watermark ({s.high_watermark}), got {s.low_watermark}")
    if src.ok(("admin",)):
        if cfg.admin.listen and not (cfg.admin.token or cfg.admin.token_file or cfg.admin.tokens):
            src.add(("admin", "listen"), "the admin API over TCP needs `token`, `token_file` or "
                    "[[admin.tokens]] set")
        if cfg.admin.token and cfg.admin.token_file:
            src.add(("admin", "token_file"), "give either `token` or `token_file`, not both")
    names = set()
    for i, t in enumerate(cfg.admin.tokens):
        where = ("admin", "tokens", i)
        if src.ok(where + ("name",)):
            if t.name in names:
                src.add(where + ("name",), f"expected a unique token name, {t.name!r} repeats")
            names.add(t.name)
        sources = [k for k in ("token_file", "token_env", "token") if getattr(t, k)]
        if src.ok(*(where + (k,) for k in ("token_file", "token_env", "token"))) and len(sources) != 1:
            src.add(where + ("token_file",), "expected exactly one of token_file, token_env or token"
                    + (f", got {' and '.join(sources)}" if sources else ""))
    if src.ok(("upload", "part_size")) and cfg.upload.part_size < 5 << 20:
        src.add(("upload", "part_size"), f"expected at least 5MiB (an S3 limit), got {cfg.upload.part_size}")
    if src.ok(("upload", "min_concurrency"), ("upload", "max_concurrency")) \
            and cfg.upload.min_concurrency > cfg.upload.max_concurrency:
        src.add(("upload", "min_concurrency"), "expected at most max_concurrency")
    if src.ok(("s3", "access_key"), ("s3", "secret_key")) \
            and (cfg.s3.access_key is None) != (cfg.s3.secret_key is None):
        src.add(("s3", "access_key"), "expected access_key and secret_key together (or neither)")
    seen = {}
    for i, e in enumerate(cfg.exports):
        if not src.ok(("exports", i, "path")):
            continue
        if e.path in seen:
            src.add(("exports", i, "path"), f"expected a unique path; {e.path!r} is already export "
                    f"{seen[e.path]}")
        seen[e.path] = i
        for j, other in enumerate(cfg.exports[:i]):
            if not src.ok(("exports", j, "path")):
                continue
            if e.path.startswith(other.path.rstrip("/") + "/") or other.path.startswith(e.path.rstrip("/") + "/"):
                src.add(("exports", i, "path"), f"expected exports not nested in each other; "
                        f"{e.path!r} and {other.path!r} are")
    names = set()
    for i, rule in enumerate(cfg.retention.series):
        where = ("retention", "series", i)
        if src.ok(where + ("name",)):
            if rule.name in names:
                src.add(where + ("name",), f"expected a unique series name, {rule.name!r} repeats")
            names.add(rule.name)
        if src.ok(where + ("expire_after",), where + ("min_age",)) \
                and rule.expire_after is not None and rule.expire_after < rule.min_age:
            src.add(where + ("expire_after",), f"expected at least min_age ({fmt_seconds(rule.min_age)}), "
                    f"got {fmt_seconds(rule.expire_after)}")
        afters = set()
        for j, t in enumerate(rule.transitions):
            at = where + ("transitions", j, "after")
            if not src.ok(at):
                continue
            if t.after in afters:
                src.add(at, f"expected distinct ages, {fmt_seconds(t.after)} repeats")
            afters.add(t.after)
            if src.ok(where + ("expire_after",)) and rule.expire_after is not None \
                    and t.after >= rule.expire_after:
                src.add(at, "expected less than expire_after "
                        f"({fmt_seconds(rule.expire_after)}): the checkpoint is deleted first")
    r = cfg.retention
    if src.ok(("retention", "pin_lock"), ("retention", "pin_lock_days")) \
            and r.pin_lock in ("governance", "compliance") and r.pin_lock_days < 1:
        src.add(("retention", "pin_lock_days"), f"expected at least 1 day with pin_lock = {r.pin_lock!r}")
    if src.ok(("retention", "schedule")) and r.schedule is not None and r.schedule < 60:
        src.add(("retention", "schedule"), f"expected at least {fmt_seconds(60)} (or \"never\"), got {fmt_seconds(r.schedule)}")
    # the uploader's own settings checks, so nothing it would refuse gets past check-config
    # (a backstop: only when nothing above found a problem in what they read, so a problem is
    # named once)
    if not src.ok(("s3",), ("upload",), ("server", "evict_interval")):
        return
    try:
        cfg.s3_settings(endpoint=cfg.s3.endpoint or "http://127.0.0.1:1")
        cfg.upload_settings()
    except ImportError:
        pass
    except ValueError as e:
        section = "s3" if str(e).startswith("s3") else "upload"
        src.add((section,), str(e))


def load(path: str | None, overrides: dict[tuple, tuple[str, Any]] | None = None) -> Config:
    """Read `path` (None: defaults only), apply command-line `overrides`
    ({("server", "listen"): ("--listen", "0.0.0.0:2049"), ("exports",): ("--export", [...])}),
    validate, and return the Config. Raises ConfigError."""
    text = None
    raw: dict = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ConfigError(path, "file", f"cannot be read: {e.strerror}") from None
        try:
            text = data.decode("utf-8")
            raw = tomllib.loads(text)
        except UnicodeDecodeError as e:
            raise ConfigError(path, "file", f"expected UTF-8 text ({e.reason} at byte {e.start})") from None
        except tomllib.TOMLDecodeError as e:
            line = re.search(r"line (\d+)", str(e))
            where = f"{path}:{line.group(1)}" if line else path
            raise ConfigError(where, "syntax", f"not valid TOML: {e}") from None
    flags: dict[tuple, str] = {}
    for key_path, (flag, value) in (overrides or {}).items():
        node = raw
        for part in key_path[:-1]:
            node = node.setdefault(part, {})
        node[key_path[-1]] = value
        flags[key_path] = flag
        if key_path == ("exports",):
            for i, item in enumerate(value):
                for k in item:
                    flags[("exports", i, k)] = flag
    src = _Source(path, text, flags)
    known = list(SECTIONS) + ["exports", "retention"]
    for key in raw:
        if key not in known:
            src.errors.append(_unknown_key(src, (key,), known))
    kwargs: dict[str, Any] = {"source": path}
    for name, cls in SECTIONS.items():
        if name in raw:
            kwargs[name] = _build(cls, raw[name], (name,), src)
    if "exports" in raw:
        if not isinstance(raw["exports"], list) or not raw["exports"]:
            src.add(("exports",), "expected one or more [[exports]] tables")
        else:
            kwargs["exports"] = tuple(_build(ExportSettings, item, ("exports", i), src)
                                      for i, item in enumerate(raw["exports"]))
    if "retention" in raw:
        kwargs["retention"] = _build(RetentionSettings, raw["retention"], ("retention",), src)
    cfg = Config(**kwargs)          # a value in error holds its default here
    _check(cfg, src)                # the rules across keys, on the values that parsed
    src.raise_if_any()              # every problem of every key and rule, at once
    return cfg


# ---- what a reload does with each option -------------------------------------------

def _array_effects(cls) -> tuple[str, ...]:
    """An array of tables reloads as one unit: "restart" if any of its keys needs one."""
    effects = set()
    for f in fields(cls):
        if "table_array" in f.metadata:
            effects.update(_array_effects(f.metadata["table_array"]))
        else:
            effects.add(f.metadata.get("reload") or cls.reload_default)
    return ("restart",) if "restart" in effects else tuple(sorted(effects))


def reload_policy() -> dict[str, tuple[str, ...]]:
    """Every option's dotted key ("server.high_watermark", "exports", "retention.series") ->
    the RELOAD_EFFECTS a change of it calls for. Derived from the declarations above: the
    reload diff, the example file and the tests all read it, so a new option is covered by
    being declared."""
    out: dict[str, tuple[str, ...]] = {}
    for name, cls in [*SECTIONS.items(), ("retention", RetentionSettings)]:
        for f in fields(cls):
            key = f"{name}.{f.name}"
            out[key] = (_array_effects(f.metadata["table_array"]) if "table_array" in f.metadata
                        else (f.metadata.get("reload") or cls.reload_default,))
    out["exports"] = _array_effects(ExportSettings)
    return out


def option_value(cfg: "Config", key: str):
    section, _, name = key.partition(".")
    value = getattr(cfg, section)
    return getattr(value, name) if name else value


def default_config_path() -> str | None:
    return DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else None


# ---- command-line flags --------------------------------------------------------------

def flag_options() -> list[tuple[str, tuple, str]]:
    """(flag, key path, help) for every scalar option: --KEY for [server], --TABLE-KEY otherwise."""
    out = []
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            if "table_array" in f.metadata:      # [[admin.tokens]]: the file only
                continue
            name = f.name.replace("_", "-")
            flag = f"--{name}" if section == "server" else f"--{section}-{name}"
            out.append((flag, (section, f.name), f.metadata["doc"]))
    return out


def parse_export_flag(text: str) -> dict:
    """--export PATH[:NETWORKS[:rw|ro[:SQUASH[:secure|insecure]]]], NETWORKS comma-separated:
    "/checkpoints:10.0.0.0/8,127.0.0.1:rw:root:insecure"."""
    parts = text.split(":")
    key = f"--export {text!r}"
    if len(parts) == 5 and parts[4] in ("secure", "insecure", ""):
        secure = {"secure": True, "insecure": False, "": None}[parts.pop()]
    elif len(parts) == 5:
        raise ConfigError(None, key, f"expected the fifth field to be secure or insecure, got {parts[4]!r} "
                          "(PATH:NETWORKS:rw|ro:SQUASH:secure|insecure)")
    else:
        secure = None
    if len(parts) > 4:
        # IPv6 networks contain ':' too: splitting them out of the fields is left to the config file
        raise ConfigError(None, key, f"expected at most 5 fields, got {len(parts)}: "
                          "PATH[:NETWORKS[:rw|ro[:none|root|all[:secure|insecure]]]] "
                          "(IPv6 networks: use the config file)")
    item: dict[str, Any] = {"path": parts[0]}
    if len(parts) > 1 and parts[1]:
        item["networks"] = parts[1]
    if len(parts) > 2 and parts[2]:
        item["access"] = parts[2]
    if len(parts) > 3 and parts[3]:
        item["squash"] = parts[3]
    if secure is not None:
        item["secure"] = secure
    return item


def with_exports(cfg: Config, exports: tuple) -> Config:
    return replace(cfg, exports=exports)
