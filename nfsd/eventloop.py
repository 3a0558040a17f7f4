"""The event loop the server runs on: uvloop (libuv under the asyncio API, issue 37).

uvloop answers a canned-reply RPC call for less CPU than the stdlib loop (bench/README.md, the
report's "per request" rows), and its transports try the socket at once on `write`. Every
entry point that serves (the appliance's `ckptgw serve`, `python -m nfsd`) starts its loop here.
CKPTGW_LOOP=asyncio runs the stdlib loop instead (A/B measurements, and a way out if a uvloop
bug ever bites in the field); any other value is an error, not a silent default.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Coroutine

LOOPS = ("uvloop", "asyncio")


def loop_name() -> str:
    name = os.environ.get("CKPTGW_LOOP", "").strip().lower() or "uvloop"
    if name not in LOOPS:
        raise ValueError(f"CKPTGW_LOOP={name!r}: expected one of {', '.join(LOOPS)}")
    return name


def new_event_loop() -> asyncio.AbstractEventLoop:
    if loop_name() == "uvloop":
        import uvloop
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """asyncio.run(main) on the configured loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
