"""Dev entry point: python -m nfsd --listen 127.0.0.1:PORT --cache-dir DIR --export /checkpoints

Runs in the foreground; SIGTERM/SIGINT stop it cleanly (stop accepting, finish
in-flight calls, close the store).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys

import structlog

from cache.store import Store
from nfsd import eventloop
from nfsd.exports import Exports
from nfsd.limits import Limits
from nfsd.server import NfsServer
from nfsd.state import DEFAULT_LEASE_TIME


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_limit(value: str) -> tuple[str, float]:
    """NAME=VALUE for a field of nfsd.limits.Limits (e.g. record_timeout=5)."""
    name, sep, raw = value.partition("=")
    kinds = {f.name: f.type for f in dataclasses.fields(Limits)}
    if not sep or name not in kinds:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with NAME one of {', '.join(kinds)}")
    try:
        number = float(raw) if kinds[name] in (float, "float") else int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: expected a number, got {raw!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{name}: expected a positive number, got {raw!r}")
    return name, number


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nfsd", description=__doc__.splitlines()[0])
    p.add_argument("--listen", type=parse_listen, default=("127.0.0.1", 2049),
                   help="HOST:PORT to listen on (default 127.0.0.1:2049)")
    p.add_argument("--cache-dir", required=True, help="the store's directory")
    p.add_argument("--export", default="/checkpoints", help="export path (default /checkpoints)")
    # The dev default is no squashing: the kernel-client harness and tests act as root.
    p.add_argument("--root-squash", action="store_true",
                   help="map uid/gid 0 to nobody (default: off for this dev entry point)")
    # Likewise `insecure`: the harness, nfs-rs (noresvport) and tests use unprivileged ports.
    # The appliance's exports default to `secure`, as knfsd's do.
    p.add_argument("--secure", action="store_true",
                   help="require a source port < 1024 (default: off for this dev entry point)")
    p.add_argument("--limit", type=parse_limit, action="append", default=[], metavar="NAME=VALUE",
                   help="override a connection limit of nfsd/limits.py (repeatable)")
    p.add_argument("--lease-time", type=float, default=DEFAULT_LEASE_TIME,
                   help="NFSv4 lease time in seconds (default 90)")
    p.add_argument("--grace-time", type=float, default=None,
                   help="grace period after a start, for clients to reclaim their state "
                        "(seconds; default: the lease time)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


async def run(args) -> None:
    try:
        store = Store.open(args.cache_dir)
    except OSError as exc:                  # StoreError included: it names the problem
        raise SystemExit(f"python -m nfsd: cannot open the store in {args.cache_dir}: {exc}") from None
    try:
        server = NfsServer(store, Exports.single(args.export, root_squash=args.root_squash,
                                                  secure=args.secure),
                           args.lease_time, limits=Limits(**dict(args.limit)),
                           grace_time=args.grace_time)
        try:
            await server.start(*args.listen)
        except OSError as exc:
            raise SystemExit(f"python -m nfsd: cannot listen on {args.listen[0]}:{args.listen[1]}: "
                             f"{exc.strerror or exc}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        structlog.get_logger("nfsd").info("nfsd_stopping")
        await server.stop()
    finally:
        await asyncio.to_thread(store.close)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # One log line at a time even when stdout is a file or pipe (tests read the port and
    # events from it while the server runs).
    sys.stdout.reconfigure(line_buffering=True)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(
        getattr(logging, args.log_level.upper())), cache_logger_on_first_use=True)
    eventloop.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
