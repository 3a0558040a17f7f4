"""`ckptgw wait PATH`: block until a file (or every file under a directory) is in S3, read
through the NFSv4.2 mount (appliance/waiting.py): no admin socket, no token, any client node.
Registered on the CLI group at the end of appliance/cli.py; what it prints and exits with is
appliance/cliout.py's, as every command's."""
from __future__ import annotations

import sys

import click

from .cliout import EXIT, emit_json, fail, json_option
from .units import fmt_bytes
from .waiting import NotOffered, NotUploaded, wait_uploaded


def _progress(enabled: bool):
    """One line on stderr whenever what is pending changes (a terminal only)."""
    last: list = [None]

    def show(st) -> None:
        now = (st.state, st.pending_files, st.pending_bytes)
        if not enabled or st.done or now == last[0]:
            return
        last[0] = now
        if st.is_dir:
            click.echo(f"waiting: {st.pending_files} file(s), {fmt_bytes(st.pending_bytes)} "
                       "not in S3 yet", err=True)
        else:
            click.echo(f"waiting: {st.state}", err=True)
    return show


@click.command("wait")
@click.option("--timeout", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Give up after this long (exit 4). Default: wait as long as it takes.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              metavar="SECONDS", help="Seconds between reads of the attributes.")
@json_option
@click.argument("path", type=click.Path())
def wait(timeout, interval, as_json, path):
    """Wait until PATH (a file, or every file under a directory) is in S3.

    Runs on any machine that mounts the export with NFS 4.2 (`mount -o vers=4.2`): it reads
    the user.ckptgw.* extended attributes, needs neither the admin socket nor a token.
    Exit 0 when done, 4 on timeout, 3 when the mount does not offer the attributes (not a
    ckptgw export, or not NFS 4.2), 5 when PATH does not exist, 6 when it may not be read."""
    try:
        st = wait_uploaded(path, timeout=timeout, interval=interval,
                           on_poll=_progress(not as_json and sys.stderr.isatty()))
    except NotUploaded as e:
        if as_json:
            click.echo(f"ckptgw: {e}", err=True)
            emit_json({"ok": False, "code": "timeout", "exit": EXIT["timeout"], "error": str(e),
                       **e.state.as_dict()})
            sys.exit(EXIT["timeout"])
        fail(str(e), "timeout")
    except NotOffered as e:
        fail(e.strerror, "unavailable")
    except FileNotFoundError:
        fail(f"{path}: no such file or directory", "not_found")
    except PermissionError:
        fail(f"{path}: permission denied reading its user.ckptgw.* attributes", "denied")
    except OSError as e:
        fail(f"{path}: {e.strerror or e}")
    if as_json:
        return emit_json({"ok": True, **st.as_dict()})
    if st.is_dir:
        click.echo(f"{path}: every file in S3")
    else:
        obj = st.object
        extra = "".join(f" {k} {obj[k]}" for k in ("etag", "version") if k in obj)
        click.echo(f"{path}: in S3 as {obj.get('key', '?')}{extra}")
