"""Every test's event loop is the one the gateway serves on: uvloop (nfsd/eventloop.py), unless
CKPTGW_LOOP=asyncio asks for the stdlib loop. asyncio.run() and friends take it from the policy."""
from __future__ import annotations

import asyncio

from nfsd import eventloop

if eventloop.loop_name() == "uvloop":
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
