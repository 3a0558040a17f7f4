"""Render docs/config.example.toml from the option declarations in appliance.config, so the
example always lists every option with its default and its comment.

    python -m appliance.config_example > docs/config.example.toml
"""
from __future__ import annotations

import textwrap
from dataclasses import MISSING, fields

from . import config as c

INTRO = """\
# ckptgw configuration: every option with its default.
#
# Install as /etc/ckptgw/config.toml (`ckptgw serve` reads it when present; --config PATH
# names another). Check a file with `ckptgw check-config PATH` (exit 0: good). Every option is
# also a flag of `ckptgw serve`: [server] keys as --KEY (--listen, --cache-dir), the others as
# --TABLE-KEY (--s3-endpoint, --metrics-listen, --upload-settle); exports as repeatable
# --export PATH[:NETWORKS[:rw|ro[:SQUASH[:secure|insecure]]]].
#
# Sizes: bytes, or "512KiB" "8MiB" "500GiB" (binary) / "10GB" (decimal).
# Durations: seconds, or "500ms" "90s" "5m" "2h" "30d" "1w".
# SIGHUP (systemctl reload ckptgw, or `ckptgw reload`) re-reads this file: each option below
# says whether a reload applies it or it needs a restart (then it is reported as such and keeps
# its running value until the next start).
"""

SECTION_INTROS = {
    "server": "The NFS server and the local cache.",
    "admin": "The admin API used by the `ckptgw` commands. Nothing admin is reachable over the network\n"
             "unless `listen` and a token are set.",
    "metrics": "Prometheus metrics (text format at http://LISTEN/metrics).",
    "log": "Logs go to stderr (the journal under systemd), one event per line.",
    "s3": "Where checkpoints go. With `endpoint` empty, ckptgw runs in TRY-OUT mode on an embedded\n"
          "in-memory S3: nothing in it survives a restart.",
    "upload": "When and how fast the uploader sends data.",
    "pair": "One gateway of an active/passive HA pair (docs/operations.md, CkptgwPairDegraded): the\n"
            "DRBD device of the cache volume, so status and metrics show whether the peer is in sync.",
}


def _toml(value) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(value)


_SIZE_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_DURATION_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def _human(value, parse) -> str:
    """A default as an operator would write it: sizes and durations with units."""
    if parse in (c._size, c._opt_size) and isinstance(value, int) and value:
        for unit, n in _SIZE_UNITS:
            if value % n == 0:
                return f'"{value // n}{unit}"'
    if parse in (c._duration, c._opt_duration) and isinstance(value, float) and value:
        for unit, n in _DURATION_UNITS:
            if value % n == 0 and not (unit == "m" and value < 600):    # "60s" reads better than "1m"
                return f'"{int(value // n)}{unit}"'
        if (value * 1000).is_integer():
            return f'"{int(value * 1000)}ms"'
    return _toml(value)


def _comment(text: str, prefix: str = "# ") -> list[str]:
    return [prefix + line for line in textwrap.wrap(text, 96 - len(prefix))]


def _reload_note(cls, meta) -> str:
    if "table_array" in meta:
        return ""
    return (" Needs a restart." if (meta.get("reload") or cls.reload_default) == "restart"
            else " Applied on reload.")


def _fields(cls, commented: bool = False) -> list[str]:
    out = []
    lead = "# " if commented else ""
    for f in fields(cls):
        meta = f.metadata
        if "table_array" in meta and not commented:
            continue                     # rendered as its own [[...]] tables
        out += _comment(meta["doc"] + _reload_note(cls, meta))
        default = f.default if f.default is not MISSING else None
        value = meta.get("example") or _human(default, meta.get("parse"))
        out.append(f"{lead}{f.name} = {value}")
    return out


def render() -> str:
    out = [INTRO]
    for name, cls in c.SECTIONS.items():
        out += [""] + _comment(SECTION_INTROS[name]).copy() + [f"[{name}]"] + _fields(cls) + [""]
        if name == "admin":
            out += ["# Scoped TCP admin tokens, one [[admin.tokens]] table each (none by default; token and",
                    "# token_file above are one of scope \"admin\"). An example with every key:",
                    "# [[admin.tokens]]"] + _fields(c.AdminToken, commented=True) + [""]
    out += ["", "# Exports: one [[exports]] table each. With one export the whole cache is served at its",
            "# path; with several, each is the cache directory of the same name (and S3 keys start with it).",
            "[[exports]]"] + _fields(c.ExportSettings) + [""]
    out += ["", "# Retention: checkpoint series and how long their steps live (used by `ckptgw retention`",
            "# and `ckptgw lifecycle`).", "[retention]"] + _fields(c.RetentionSettings)
    out += ["", "# No series by default; an example with every key:",
            "# [[retention.series]]"] + _fields(c.SeriesRule, commented=True)
    out += ["# [[retention.series.transitions]]   (or inline: transitions = [{after = \"30d\", ...}])"]
    out += _fields(c.Transition, commented=True)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
