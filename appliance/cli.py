"""`ckptgw`: run the daemon (`serve`), check a config file, and administer a running daemon
through its admin API. Every admin command takes --json; exit codes are listed in EXIT.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import fields as dataclass_fields

import click

from . import config as configmod
from . import version as versionmod
from .admin import DEFAULT_CLIENT_TIMEOUT, AdminClient, AdminError
from .cliout import EX_CONFIG, EXIT, emit_json, fail, json_option
from .progress import Bar as _Bar
from .units import fmt_bytes, fmt_rate, fmt_seconds, table
from .wait_cmd import wait as wait_command

# The group's options, also accepted after the command where people type them
# (`ckptgw serve --config X`, `ckptgw status --socket S`): flag -> (ctx.obj key, click type, metavar).
# Given there, they win over the same option before the command and its environment variable.
GROUP_OPTIONS = {"--socket": ("socket", None, "PATH"), "--admin": ("tcp", None, "HOST:PORT"),
                 "--token": ("token", None, "TOKEN"), "--token-file": ("token_file", None, "PATH"),
                 "--config": ("config", None, "PATH"),
                 "--admin-timeout": ("timeout", click.FloatRange(min=0.1), "SECONDS")}


def _set_group_option(ctx, param, value):
    if value is not None:
        ctx.find_root().obj[GROUP_OPTIONS[param.opts[0]][0]] = value


class CkptgwGroup(click.Group):
    """A group whose commands (and its subgroups' commands) also take GROUP_OPTIONS."""

    def add_command(self, cmd, name=None):
        super().add_command(cmd, name)
        if isinstance(cmd, click.Group):
            return
        taken = {o for p in cmd.params for o in getattr(p, "opts", ())}
        for flag, (_, kind, metavar) in GROUP_OPTIONS.items():
            if flag not in taken:
                cmd.params.append(click.Option([flag], type=kind, metavar=metavar, expose_value=False,
                                               callback=_set_group_option,
                                               help=f"As `ckptgw {flag} {metavar} COMMAND`."))


CkptgwGroup.group_class = CkptgwGroup


@click.group(cls=CkptgwGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--socket", "socket_path", envvar="CKPTGW_ADMIN_SOCKET", metavar="PATH",
              help="Admin socket of the daemon (default: from the config file).")
@click.option("--admin", "admin_tcp", envvar="CKPTGW_ADMIN", metavar="HOST:PORT",
              help="Use the admin API over TCP (needs --token or --token-file).")
@click.option("--token", envvar="CKPTGW_ADMIN_TOKEN", metavar="TOKEN",
              help="Admin token for --admin. A flag is visible to every user in `ps`: prefer "
                   "$CKPTGW_ADMIN_TOKEN or --token-file.")
@click.option("--token-file", envvar="CKPTGW_ADMIN_TOKEN_FILE", metavar="PATH",
              help="Read the admin token for --admin from this file (its first line), e.g. the daemon's "
                   "admin.token_file.")
@click.option("--config", "config_path", envvar="CKPTGW_CONFIG", metavar="PATH",
              help=f"Config file (default {configmod.DEFAULT_CONFIG_PATH} when present).")
@click.option("--admin-timeout", type=click.FloatRange(min=0.1), default=DEFAULT_CLIENT_TIMEOUT,
              envvar="CKPTGW_ADMIN_TIMEOUT", show_default=True, metavar="SECONDS",
              help="Give up (exit 4) when the daemon says nothing for this long; a running command "
                   "sends a heartbeat, so this bounds a wedged daemon, not a long command.")
@click.version_option(versionmod.version(), "--version", "-V", message=versionmod.describe(),
                      help="Show the version and the on-disk store format, and exit.")
@click.pass_context
def main(ctx, socket_path, admin_tcp, token, token_file, config_path, admin_timeout):
    """ckptgw: NFSv4 checkpoint caching gateway in front of S3."""
    ctx.obj = {"socket": socket_path, "tcp": admin_tcp, "token": token, "token_file": token_file,
               "config": config_path, "timeout": admin_timeout}


# ---- serve ------------------------------------------------------------------------------

def _default_text(f) -> str | None:
    """The declared default as one would type it on the command line ("8MiB", "90s", "0600")."""
    from dataclasses import MISSING

    from .config_example import _human
    value, parse = f.default, f.metadata["parse"]
    if value is None or value is MISSING or value == "":
        return None                     # derived at start or none: the option's help says so
    if parse in (configmod._mode, configmod._dir_mode):
        return f"{value:04o}"
    if isinstance(value, tuple) and parse is configmod._address:
        return f"{value[0]}:{value[1]}"
    return _human(value, parse).strip('"')


# Secrets given to `serve`: a flag is visible to every user in `ps`, so each is also read from the
# environment (flag -> variable; the admin token's are the same the admin commands read), and the
# help says so. The S3 credentials come from boto3's chain (AWS_* variables, ~/.aws) when unset.
SECRET_ENV = {"--admin-token": "CKPTGW_ADMIN_TOKEN", "--admin-token-file": "CKPTGW_ADMIN_TOKEN_FILE"}
SECRET_FLAGS = {
    "--admin-token": "A flag is visible to every user in `ps`: prefer $CKPTGW_ADMIN_TOKEN, --admin-token-file "
                     "or admin.token_file.",
    "--admin-token-file": "Also $CKPTGW_ADMIN_TOKEN_FILE.",
    "--s3-secret-key": "A flag is visible to every user in `ps`: prefer $AWS_SECRET_ACCESS_KEY or ~/.aws "
                       "(leave access_key and secret_key unset).",
    "--s3-session-token": "A flag is visible to every user in `ps`: prefer $AWS_SESSION_TOKEN.",
}
# The token's two sources exclude each other; one given by flag or environment replaces the file's.
TOKEN_SOURCES = (("admin", "token"), ("admin", "token_file"))


def _serve_options(fn):
    for flag, path, doc in reversed(configmod.flag_options()):
        f = {f.name: f for f in dataclass_fields(configmod.SECTIONS[path[0]])}[path[1]]
        choices = getattr(f.metadata["parse"], "choices", None)
        default = _default_text(f)
        fn = click.option(flag, "opt__" + "__".join(path), default=None,
                          type=click.Choice(choices) if choices else None,
                          metavar=None if choices else f.metadata["metavar"], envvar=SECRET_ENV.get(flag),
                          help=" ".join(filter(None, (doc, SECRET_FLAGS.get(flag))))
                          + (f"  [default: {default}]" if default is not None else ""))(fn)
    fn = click.option("--export", "exports", multiple=True,
                      metavar="PATH[:NETS[:rw|ro[:SQUASH[:secure|insecure]]]]",
                      help="An export (repeatable; replaces the file's [[exports]]). NETS: comma-separated "
                           "CIDRs (default loopback); rw|ro default rw; SQUASH: none|root|all (default root); "
                           "insecure admits clients on unprivileged source ports (nfs-rs), default secure.")(fn)
    return fn


def _overrides(params: dict, exports: tuple, from_env: frozenset = frozenset()) -> dict:
    """{key path: (flag, value)} for the options given; `from_env`: the flags whose value came from
    their environment variable (named as $VAR in errors)."""
    out = {}
    flags = {tuple(path): flag for flag, path, _ in configmod.flag_options()}
    for name, value in params.items():
        if name.startswith("opt__") and value is not None:
            path = tuple(name[len("opt__"):].split("__"))
            flag = flags[path]
            out[path] = (f"${SECRET_ENV[flag]}" if flag in from_env else flag, value)
    given = [p for p in TOKEN_SOURCES if p in out]
    if len(given) == 1:                 # the token from here, not from the file's other source
        other = TOKEN_SOURCES[1 - TOKEN_SOURCES.index(given[0])]
        out[other] = (out[given[0]][0], "")
    if exports:
        out[("exports",)] = ("--export", [configmod.parse_export_flag(e) for e in exports])
    return out


def _flag_path(flag: str) -> tuple:
    return next(tuple(path) for f, path, _ in configmod.flag_options() if f == flag)


@main.command()
@_serve_options
@click.pass_context
def serve(ctx, exports, **params):
    """Run the gateway in the foreground (systemd Type=notify). Without an S3 endpoint it runs in
    try-out mode on an embedded in-memory S3."""
    from nfsd import eventloop

    from . import daemon, logs
    path = ctx.obj["config"] or configmod.default_config_path()
    try:
        from_env = frozenset(flag for flag in SECRET_ENV
                             if ctx.get_parameter_source("opt__" + "__".join(_flag_path(flag)))
                             is click.core.ParameterSource.ENVIRONMENT)
        overrides = _overrides(params, exports, from_env)
        cfg = configmod.load(path, overrides)
    except configmod.ConfigError as e:
        click.echo(f"ckptgw: configuration error: {e}", err=True)
        sys.exit(EX_CONFIG)
    logs.configure(cfg.log.format, cfg.log.level)
    code = eventloop.run(daemon.serve(cfg, overrides))
    # Everything is closed and durable by now. Tearing down the interpreter (garbage-collecting
    # boto3's and moto's object graphs, joining idle pool threads) takes seconds for nothing,
    # and systemd's stop timeout is ticking: flush the logs and leave.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@main.command("check-config")
@click.option("--json", "as_json", is_flag=True,
              help='{"ok": true|false, "path", "problems": [{"where", "key", "expected"}]} on stdout.')
@click.argument("path", type=click.Path(dir_okay=False))
def check_config(as_json, path):
    """Validate a config file: exit 0 if it is good, else 1 with every problem (line, key, expectation)."""
    try:
        cfg = configmod.load(path)
    except configmod.ConfigError as e:
        click.echo(f"ckptgw: {e}", err=True)
        if as_json:
            emit_json({"ok": False, "path": path, "problems": [
                {"where": p.where, "key": p.key, "expected": p.expected} for p in e.errors]})
        sys.exit(1)
    if as_json:
        return emit_json({"ok": True, "path": path, "problems": [], "exports": len(cfg.exports),
                          "tryout": cfg.embedded_s3, "retention_series": len(cfg.retention.series)})
    click.echo(f"{path}: OK ({len(cfg.exports)} export(s), "
               f"{'embedded try-out S3' if cfg.embedded_s3 else cfg.s3.endpoint}, "
               f"{len(cfg.retention.series)} retention series)")


# ---- talking to the daemon --------------------------------------------------------------------

def _socket_path(obj: dict) -> tuple[str, str, list[str]]:
    """The admin socket to use, where that choice came from, and the sockets looked at before it
    (for the exit-7 message)."""
    if obj["socket"]:
        return obj["socket"], "from --socket or $CKPTGW_ADMIN_SOCKET", []
    skipped = []
    if not obj["config"]:
        if os.path.exists(configmod.SERVICE_ADMIN_SOCKET):
            return configmod.SERVICE_ADMIN_SOCKET, "the systemd service's", []
        skipped.append(f"{configmod.SERVICE_ADMIN_SOCKET} (the systemd service's: absent)")
    path = obj["config"] or configmod.default_config_path()
    try:
        cfg = configmod.load(path)
    except configmod.ConfigError as e:
        fail(f"cannot find the admin socket: {e}", "bad_request")
    where = f"the config file {path}" if path else "the built-in defaults"
    if cfg.admin.socket:
        return cfg.admin.socket, f"admin.socket of {where}", skipped
    return os.path.join(cfg.server.cache_dir, "admin.sock"), f"<cache_dir>/admin.sock of {where}", skipped


def _no_daemon(where: str, why: str, source: str, skipped: list[str]) -> str:
    """Exit 7's sentence: the socket tried and why that one, the ones looked at before it, and for a
    relative path what it is relative to (the daemon's and this command's directories may differ)."""
    notes = [source]
    if not os.path.isabs(where):
        notes.append(f"a relative path, relative to the current directory {os.getcwd()}: run this where "
                     "the daemon runs, or give --socket an absolute path")
    tried = f"no daemon is listening on {where} ({'; '.join(notes)}): {why}"
    if skipped:
        tried += f"; also tried {', '.join(skipped)}"
    return tried + ". Is `ckptgw serve` running? (--socket PATH or $CKPTGW_ADMIN_SOCKET names its socket)"


def call(cmd: str, args: dict | None = None, on_progress=None, prepares: tuple[str, ...] = ()):
    """Run one admin command; `prepares`: commands a confirmation may lead to, checked against the
    token's scope now (appliance/admin.py), so nobody is asked to confirm what will be refused."""
    obj = click.get_current_context().obj
    if obj["tcp"]:
        where, source, skipped = obj["tcp"], "from --admin or $CKPTGW_ADMIN", []
    else:
        where, source, skipped = _socket_path(obj)
    timeout = obj.get("timeout", DEFAULT_CLIENT_TIMEOUT)
    wedged = (f"the daemon at {where} did not answer within {fmt_seconds(timeout)}: is it wedged? "
              "(see its log, e.g. `journalctl -u ckptgw`; --admin-timeout waits longer)")
    try:
        if obj["tcp"]:
            client = AdminClient(tcp=configmod._address(obj["tcp"]), token=_client_token(obj), timeout=timeout)
        else:
            client = AdminClient(socket_path=where, timeout=timeout)
    except TimeoutError:
        fail(wedged, "timeout")
    except PermissionError:
        fail(f"permission denied on the admin socket {where}: run as the daemon's user, root, or a "
             "member of the admin group", "denied")
    except FileNotFoundError:
        fail(_no_daemon(where, "no such socket", source, skipped), "no_daemon")
    except ConnectionRefusedError:
        fail(_no_daemon(where, "connection refused (a socket left by a daemon that stopped?)" if not obj["tcp"]
                        else "connection refused", source, skipped), "no_daemon")
    except (OSError, ValueError) as e:
        fail(f"cannot reach the daemon at {where} ({source}): {e}", "no_daemon")
    try:
        with client:
            return client.call(cmd, args, on_progress, prepares=prepares)
    except AdminError as e:
        fail(e.message.rstrip(".") + ".", e.code)
    except TimeoutError:
        fail(wedged, "timeout")
    except (ConnectionError, OSError) as e:
        fail(f"lost the connection to the daemon: {e}", "no_daemon")


def _client_token(obj: dict) -> str | None:
    """The token for --admin: --token / $CKPTGW_ADMIN_TOKEN, or the first line of --token-file /
    $CKPTGW_ADMIN_TOKEN_FILE (a file keeps it out of `ps` and the shell history)."""
    if obj.get("token") and obj.get("token_file"):
        fail("give either --token ($CKPTGW_ADMIN_TOKEN) or --token-file ($CKPTGW_ADMIN_TOKEN_FILE), not both",
             "bad_request")
    if not obj.get("token_file"):
        return obj.get("token")
    try:
        with open(obj["token_file"], encoding="utf-8") as f:
            token = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read the token file {obj['token_file']}: {getattr(e, 'strerror', None) or e}", "bad_request")
    if not token:
        fail(f"the token file {obj['token_file']} has no token on its first line", "bad_request")
    return token


def _json_needs_yes(as_json: bool, yes: bool, plan_cmd: str) -> None:
    """--json without --yes is refused (exit 2) before anything is asked or done: a program
    reading JSON cannot answer a prompt, and a plan printed before the question would make
    stdout hold one document or another depending on the answer. `PLAN --json` shows the plan;
    `--yes --json` applies and prints the result."""
    if as_json and not yes:
        fail(f"--json needs --yes (nothing is asked in JSON mode); see the plan with "
             f"`ckptgw {plan_cmd} --json`", "bad_request")


# ---- commands -------------------------------------------------------------------------------

@main.command()
@json_option
def status(as_json):
    """Clients, cache use, dirty bytes, upload queue, rates, retries, last errors."""
    st = call("status")
    if as_json:
        return emit_json(st)
    cache, up, nfs = st.get("cache", {}), st.get("upload", {}), st.get("nfs", {})
    mode = "TRY-OUT (embedded in-memory S3)" if st.get("tryout") else "S3"
    rows = [
        ["mode", mode],
        ["s3", f"{st['s3']['endpoint']} bucket={st['s3']['bucket']} prefix={st['s3']['prefix'] or '-'}"],
        ["nfs listen", st.get("listen") or "-"],
        ["exports", ", ".join(st.get("exports", []))],
        ["uptime", fmt_seconds(st.get("uptime_s"))],
        ["clients", nfs.get("clients", 0)],
        ["nfs ops", f"{nfs.get('ops_total', 0)} ({nfs.get('errors_total', 0)} not NFS4_OK)"],
        ["cache used", f"{fmt_bytes(cache.get('used'))} of {fmt_bytes(cache.get('capacity'))}"],
        ["dirty", fmt_bytes(cache.get("dirty_bytes"))],
        ["upload queue", up.get("queue_depth", "-") if up.get("running") else "uploader not running"],
        ["oldest dirty", fmt_seconds(up.get("oldest_dirty_age_seconds"))],
        ["upload rate", fmt_rate(up.get("rate_bytes_per_s"))],
        ["uploaded", fmt_bytes(up.get("bytes_uploaded"))],
        ["retries", up.get("retries", 0)],
        ["throttles", up.get("throttles", 0)],
    ]
    pair = st.get("pair")
    if pair is not None:
        rows.append(["pair", _pair_text(pair)])
        rows.append(["fence constraints", _fences_text(pair)])
    if st.get("admin_tcp") or st.get("admin_tokens"):
        rows.append(["admin tcp", st.get("admin_tcp") or "off"])
        rows.append(["admin tokens", _tokens_text(st.get("admin_tokens") or [])])
    click.echo(table(["", ""], rows).split("\n", 1)[1])
    uploading = up.get("uploading") or []
    if uploading:
        click.echo("uploading:")
        click.echo(table(["  PATH", "DONE", "SIZE"],
                         [[f"  {u.get('path')}", f"{int(100 * u['bytes_done'] / u['size']) if u.get('size') else 0}%",
                           fmt_bytes(u.get("size"))] for u in uploading[:10]], right={1, 2}))
    errors = up.get("last_errors") or []
    if errors:
        click.echo("last errors:")
        for e in errors[-5:]:
            click.echo(f"  {e if isinstance(e, str) else json.dumps(e)}")


def _pair_text(pair: dict) -> str:
    """"in sync (Primary, peer Secondary, /dev/drbd0)", or what is wrong and what it means."""
    state = pair["state"].replace("_", " ")
    if pair["state"] == "unknown":
        return f"unknown: {pair.get('problem')}"
    roles = f"{pair.get('role')}, peer {pair.get('peer_role')}, {pair['device']}"
    if pair["state"] == "in_sync":
        return f"{state} ({roles})"
    left = pair.get("out_of_sync_bytes")
    lag = f", {fmt_bytes(left)} to copy" if left else ""
    return f"{state.upper()} ({roles}{lag}): {pair.get('problem')}"


def _fences_text(pair: dict) -> str:
    """DRBD's fence constraints in the CIB: "none", "drbd-fence-by-handler-r0-drbd-clone (promotion
    only on gw-a)", or "unknown: why"."""
    fences = pair.get("fence_constraints")
    if fences is None:
        return f"unknown: {pair.get('fence_constraints_error') or 'not read'}"
    if not fences:
        return "none"
    return ", ".join(f["id"] + (f" (promotion only on {', '.join(f['only_on'])})" if f.get("only_on") else "")
                     for f in fences)


def _tokens_text(tokens: list[dict]) -> str:
    """"ci (read), jobs (flush, env JOBS_TOKEN)": each TCP admin token's name and scope, and where
    its secret is read from when that is not the config file itself; never the secret."""
    if not tokens:
        return "none"
    parts = []
    for t in tokens:
        src = t.get("secret_from")
        parts.append(f"{t['name']} ({t['scope']}" + (f", {src})" if src and src != "config" else ")"))
    return ", ".join(parts)


def _state_text(entry: dict) -> str:
    if entry["state"] == "uploading" and entry.get("progress") is not None:
        return f"uploading {int(entry['progress'] * 100)}%"
    return entry["state"]


FILE_STATES = ("dirty", "queued", "uploading", "clean", "absent")


@main.command("ls")
@click.option("--state", "states", multiple=True, type=click.Choice(FILE_STATES),
              help="Only files in this state (repeatable), e.g. `ls -R --state dirty /` for what is "
                   "not yet in S3.")
@click.option("-R", "--recursive", is_flag=True, help="List the whole subtree.")
@json_option
@click.argument("path", default="/")
def ls_cmd(states, recursive, as_json, path):
    """Files under PATH with their state: dirty, queued, uploading N%, clean, absent; and pins."""
    res = call("ls", {"path": path, "recursive": recursive})
    if states:
        res["entries"] = [e for e in res["entries"] if e["type"] == "reg" and e["state"] in states]
    if as_json:
        return emit_json(res)
    rows = [[e["path"] + ("/" if e["type"] == "dir" else ""), e["type"],
             fmt_bytes(e["size"]) if e["type"] == "reg" else "-",
             _state_text(e) if e["type"] == "reg" else "-",
             (f"pinned ({e['pin_reason']})" if e.get("pin_reason") else "pinned") if e["pinned"] else ""]
            for e in res["entries"]]
    click.echo(table(["PATH", "TYPE", "SIZE", "STATE", "PIN"], rows, right={2}))


@main.command()
@click.option("--wait", is_flag=True, help="Wait until everything under PATH is clean in S3.")
@click.option("--timeout", type=float, metavar="SECONDS", help="Give up waiting after this long (exit 4).")
@json_option
@click.argument("path", default="/")
def flush(wait, timeout, as_json, path):
    """Upload everything under PATH now (skip the settle time); with --wait, until it is in S3."""
    bar = _Bar("flushing", wait and not as_json)
    first = {}

    def progress(p):
        first.setdefault("pending", p["pending_bytes"])
        bar.update(first["pending"] - p["pending_bytes"], first["pending"])
    try:
        res = call("flush", {"path": path, "wait": wait, "timeout": timeout}, progress)
    finally:
        bar.close()
    if as_json:
        return emit_json(res)
    if wait:
        click.echo(f"{path}: all {fmt_bytes(res['total_bytes'])} in S3")
    else:
        if not res["pending_files"]:         # nothing done: say so, not "0 file(s) queued"
            click.echo(f"{path}: nothing to upload, all {fmt_bytes(res['total_bytes'])} in S3")
        else:
            click.echo(f"{path}: {res['pending_files']} file(s), {fmt_bytes(res['pending_bytes'])} "
                       "queued for upload")


@main.command()
@click.option("--reason", default="admin", help="Why (shown by `ls`, the retention plan and logs).")
@json_option
@click.argument("path")
def pin(reason, as_json, path):
    """Protect PATH: never evicted, expired or transitioned (Object Lock in S3 where enabled)."""
    res = call("pin", {"path": path, "reason": reason})
    if as_json:
        return emit_json(res)
    click.echo(f"pinned {res['files']} file(s) under {path}" if res["files"]
               else f"nothing pinned: no files under {path}")


@main.command()
@json_option
@click.argument("path")
def unpin(as_json, path):
    """Let files under PATH be evicted again."""
    res = call("unpin", {"path": path})
    if as_json:
        return emit_json(res)
    click.echo(f"unpinned {res['files']} file(s) under {path}" if res["files"]
               else f"nothing unpinned: no files under {path}")


@main.command()
@json_option
@click.argument("path")
def evict(as_json, path):
    """Drop the local copy of clean, unpinned files under PATH (they stay in S3)."""
    res = call("evict", {"path": path})
    if as_json:
        return emit_json(res)
    skipped = ", ".join(f"{n} {why}" for why, n in res["skipped"].items())
    click.echo((f"evicted {res['evicted_files']} file(s), freed {fmt_bytes(res['freed_bytes'])}"
                if res["evicted_files"] else f"nothing evicted under {path}")
               + (f"; skipped: {skipped}" if skipped else ""))


@main.command()
@json_option
@click.argument("path")
def warmup(as_json, path):
    """Fetch files under PATH from S3 into the cache."""
    bar = _Bar("warming up", not as_json)
    try:
        res = call("warmup", {"path": path}, lambda p: bar.update(p["done_bytes"], p["total_bytes"]))
    finally:
        bar.close()
    if as_json:
        return emit_json(res)
    click.echo(f"fetched {res['files']} file(s), {fmt_bytes(res['bytes'])}" if res["files"]
               else f"nothing to fetch: every file under {path} is in the cache")


@main.command()
@json_option
@click.argument("path", default="/")
def verify(as_json, path):
    """Compare cached files under PATH with their S3 objects (size, etag, checksum). Exit 1 on mismatch."""
    bar = _Bar("verifying", not as_json)
    try:
        res = call("verify", {"path": path}, lambda p: bar.update(p["done_bytes"], p["total_bytes"]))
    finally:
        bar.close()
    if as_json:
        emit_json(res)
    else:
        if not res["checked"]:
            click.echo(f"nothing to verify under {path}: no file there is in S3 yet "
                       f"({res['not_uploaded']} not yet uploaded)")
        else:
            click.echo(f"checked {res['checked']} file(s): {res['ok']} match, {len(res['mismatches'])} differ, "
                       f"{res['skipped_not_local']} not cached, {res['not_uploaded']} not yet uploaded")
        if res["mismatches"]:
            click.echo(table(["PATH", "PROBLEM"], [[m["path"], m["problem"]] for m in res["mismatches"]]))
    if res["mismatches"]:
        sys.exit(EXIT["problems"])


@main.command("import")
@json_option
def import_cmd(as_json):
    """Add the bucket's objects under the configured prefix that the cache lacks, as files fetched on
    first read (owner and mode from s3fs metadata) and symlinks. Names that exist locally are kept:
    local data wins."""
    res = call("import")
    if as_json:
        return emit_json(res)
    links = f" ({res['symlinks']} of them symlinks)" if res.get("symlinks") else ""
    if not res["imported"] and not res["directories"]:
        click.echo(f"nothing to import; {res['already_present']} name(s) already present (local data wins)"
                   + (f"; {len(res['invalid_keys'])} key(s) cannot be paths" if res["invalid_keys"] else ""))
        return
    click.echo(f"imported {res['imported']} object(s){links}, {res['directories']} directory marker(s); "
               f"{res['already_present']} name(s) already present (local data wins)"
               + (f"; {len(res['invalid_keys'])} key(s) cannot be paths" if res["invalid_keys"] else ""))


@main.group()
def retention():
    """Checkpoint retention ([[retention.series]] rules)."""


def _retention_table(actions: list) -> str:
    rows = [[a["action"], a["series"], a["checkpoint"], "" if a.get("step") is None else a["step"], a["age"],
             a["rule"], (f"-> {a['storage_class']}: " if a.get("storage_class") else "") + a["reason"]]
            for a in actions]
    return table(["ACTION", "SERIES", "CHECKPOINT", "STEP", "AGE", "RULE", "REASON"], rows, right={3, 4})


def _show_retention_plan(res: dict) -> None:
    for note in res.get("notes") or []:
        click.echo(f"note: {note}")
    if not res["actions"]:
        click.echo("nothing to do")
    else:
        click.echo(_retention_table(res["actions"]))
    summary = res.get("summary") or {}
    if summary:
        counts = ", ".join(f"{n} {a}" for a, n in sorted(summary.get("actions", {}).items())) or "no actions"
        click.echo(f"{summary.get('checkpoints', 0)} checkpoint(s): {summary.get('kept', 0)} kept, "
                   f"{summary.get('deleted', 0)} to delete; {counts}")


@retention.command("plan")
@json_option
def retention_plan(as_json):
    """Every action the rules call for (delete, transition, tag, lock), with rule and reason."""
    res = call("retention_plan")
    if as_json:
        return emit_json(res)
    _show_retention_plan(res)


@retention.command("apply")
@click.option("--yes", is_flag=True, help="Apply the current plan without showing it and asking.")
@json_option
def retention_apply(yes, as_json):
    """Carry the plan out (deletes at once, S3 work through the uploader's durable queue)."""
    _json_needs_yes(as_json, yes, "retention plan")
    args: dict = {}
    if not yes:
        res = call("retention_plan", prepares=("retention_apply",))     # a too-low scope: refused before the prompt
        if not res["actions"]:
            return click.echo("nothing to do")
        _show_retention_plan(res)
        if not click.confirm(f"apply these {len(res['actions'])} action(s)?", default=False, err=True):
            fail("nothing applied", "failed")
        args["only"] = [a["id"] for a in res["actions"]]     # exactly what was shown
    res = call("retention_apply", args)
    if as_json:
        return emit_json(res)
    if res.get("resumed"):
        click.echo(f"finished {len(res['resumed'])} delete(s) interrupted earlier")
    if res["actions"] or res["queued_jobs"]:
        click.echo(f"applied {len(res['actions'])} action(s); {res['queued_jobs']} S3 job(s) queued")
    elif not res.get("resumed"):
        click.echo("nothing to do")
    for sk in res.get("skipped") or []:
        click.echo(f"skipped {sk.get('checkpoint', sk.get('id'))}: {sk['why']}")


@retention.command("log")
@click.option("-n", "--limit", type=int, default=50, show_default=True, help="Newest N entries.")
@json_option
def retention_log(limit, as_json):
    """The audit log: every retention action, pin and unpin, and their S3 jobs."""
    res = call("retention_log", {"limit": limit})
    if as_json:
        return emit_json(res)
    rows = [[e.get("time", "?"), e.get("action"), e.get("status"), e.get("checkpoint") or e.get("path") or "",
             e.get("rule") or "", e.get("detail") or e.get("reason") or ""] for e in res["entries"]]
    click.echo(table(["TIME", "ACTION", "STATUS", "PATH", "RULE", "DETAIL"], rows))


@main.group()
def lifecycle():
    """The bucket's lifecycle rules derived from the retention series (transitions, expiry by tag)."""


def _show_lifecycle(res: dict) -> None:
    if not res["actions"]:
        click.echo("the bucket's lifecycle configuration is in sync")
    else:
        click.echo(table(["ACTION", "RULE", "DETAIL"], [[a["action"], a["rule"], a["detail"]] for a in res["actions"]]))
    if res.get("foreign_rules_kept"):
        click.echo(f"other rules left as they are: {', '.join(str(r) for r in res['foreign_rules_kept'])}")


@lifecycle.command("plan")
@json_option
def lifecycle_plan(as_json):
    """Show how the bucket's lifecycle configuration differs from what the rules imply."""
    res = call("lifecycle_plan")
    if as_json:
        return emit_json(res)
    _show_lifecycle(res)


@lifecycle.command("sync")
@click.option("--yes", is_flag=True, help="Write without showing the difference and asking.")
@json_option
def lifecycle_sync(yes, as_json):
    """Write our rules (IDs ckptgw-*) to the bucket; rules with other IDs are kept."""
    _json_needs_yes(as_json, yes, "lifecycle plan")
    if not yes:
        res = call("lifecycle_plan", prepares=("lifecycle_sync",))      # a too-low scope: refused before the prompt
        if res["in_sync"]:
            return _show_lifecycle(res)
        _show_lifecycle(res)
        if not click.confirm("write this lifecycle configuration?", default=False, err=True):
            fail("nothing written", "failed")
    res = call("lifecycle_sync")
    if as_json:
        return emit_json(res)
    click.echo("written and read back" if res["written"] else "already in sync")


@main.command()
@json_option
def clients(as_json):
    """NFS clients holding state."""
    res = call("clients")
    if as_json:
        return emit_json(res)
    rows = [[c["clientid"], c["peer"] or "-", f"4.{c['minorversion']}", c["sessions"],
             fmt_seconds(c["idle_s"]), c["owner"][:40]] for c in res["clients"]]
    click.echo(table(["CLIENTID", "PEER", "NFS", "SESSIONS", "IDLE", "OWNER"], rows, right={3, 4}))


@main.command()
@json_option
def exports(as_json):
    """The exports being served; SECURE: secure (AUTH_SYS clients need a source port below 1024) or
    insecure (any port, for user-space clients such as nfs-rs)."""
    res = call("exports")
    if as_json:
        return emit_json(res)
    rows = [[e["path"], ",".join(e["networks"]), e["access"], e["squash"], f"{e['anon_uid']}:{e['anon_gid']}",
             "-" if e.get("secure") is None else "secure" if e["secure"] else "insecure"]
            for e in res["exports"]]
    click.echo(table(["PATH", "NETWORKS", "ACCESS", "SQUASH", "ANON", "SECURE"], rows))


@main.command()
@json_option
def check(as_json):
    """Check the store's consistency (index against extent files). Exit 1 on problems."""
    res = call("check")
    if as_json:
        emit_json(res)
    elif res["consistent"]:
        click.echo("store is consistent")
    else:
        click.echo(f"{len(res['problems'])} problem(s):")
        for p in res["problems"]:
            click.echo(f"  {p}")
    if not res["consistent"]:
        sys.exit(EXIT["problems"])


@main.command()
@json_option
def reload(as_json):
    """Re-read the config file (like SIGHUP): exports, retention rules, log level."""
    res = call("reload")
    if as_json:
        return emit_json(res)
    click.echo(f"applied: {', '.join(res['applied']) or 'nothing changed'}")
    if res["needs_restart"]:
        click.echo(f"changed but needs a restart: {', '.join(res['needs_restart'])}")


# `ckptgw wait`: reads the mount, not the admin API (appliance/wait_cmd.py)
# without the admin options CkptgwGroup.add_command would give it: it never calls the daemon
click.Group.add_command(main, wait_command)


if __name__ == "__main__":
    main()
