"""What every `ckptgw` command ends with: its exit code (EXIT, documented in README.md "Admin
CLI"), one sentence on stderr when it fails, and under --json exactly one JSON document on
stdout. Its own module so that commands kept apart from appliance/cli.py (`ckptgw wait`,
appliance/wait_cmd.py) use the same ones without importing the CLI that registers them."""
from __future__ import annotations

import json
import sys

import click

EXIT = {"ok": 0, "failed": 1, "problems": 1, "bad_request": 2, "unavailable": 3, "timeout": 4,
        "not_found": 5, "denied": 6, "no_daemon": 7, "forbidden": 8, "busy": 1}
EX_CONFIG = 78          # sysexits.h: configuration error (systemd: RestartPreventExitStatus=78)


def fail(message: str, code: str = "failed") -> None:
    """One sentence on stderr and the exit code; under --json also the error as the one JSON
    document on stdout, so a script's parser always has something to read."""
    click.echo(f"ckptgw: {message}", err=True)
    ctx = click.get_current_context(silent=True)
    if ctx is not None and (ctx.find_root().obj or {}).get("json"):
        click.echo(json.dumps({"ok": False, "code": code, "exit": EXIT[code], "error": message}))
    sys.exit(EXIT[code])


def emit_json(result) -> None:
    click.echo(json.dumps(result, indent=2, sort_keys=True, default=str))


def _remember_json(ctx, param, value):
    if value:                       # fail() needs to know, wherever it is called from
        ctx.find_root().ensure_object(dict)["json"] = True
    return value


json_option = click.option("--json", "as_json", is_flag=True, callback=_remember_json,
                           help="Machine-readable output: exactly one JSON document on stdout "
                                '(on failure {"ok": false, "code", "exit", "error"}).')
