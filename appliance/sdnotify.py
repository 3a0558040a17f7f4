"""sd_notify(3) without a dependency: datagrams to $NOTIFY_SOCKET (systemd Type=notify)."""
from __future__ import annotations

import os
import socket
import time


def notify(*fields: str) -> bool:
    """Send e.g. notify("READY=1", "STATUS=serving"); False when not under systemd.
    A leading '@' in NOTIFY_SOCKET names an abstract socket (sd_notify(3))."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    # non-blocking: this runs on the event loop, and a receiver whose datagram queue is full
    # (net.unix.max_dgram_qlen, 10 by default) would otherwise block the whole daemon in send
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as s:
        try:
            s.connect(address)
            s.sendall("\n".join(fields).encode())
        except OSError:
            return False       # systemd gone, busy or socket wrong: not worth failing the daemon for
    return True


def ready(status: str = "") -> bool:
    return notify("READY=1", *([f"STATUS={status}"] if status else []))


def reloading() -> bool:
    # MONOTONIC_USEC lets Type=notify-reload units match this reload to the READY=1 that ends it
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={usec}")


def stopping() -> bool:
    return notify("STOPPING=1")


def status(text: str) -> bool:
    return notify(f"STATUS={text}")


def watchdog_enabled() -> bool:
    """True when systemd supervises this process with WatchdogSec= (sd_watchdog_enabled(3)):
    WATCHDOG_USEC is set and positive, and WATCHDOG_PID, when set, is our pid."""
    usec, pid = os.environ.get("WATCHDOG_USEC", ""), os.environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return False
    return usec.isdigit() and int(usec) > 0


def watchdog() -> bool:
    """WATCHDOG=1, from the daemon's heartbeat on the event loop: a loop that stops turning stops
    the pings, and systemd kills and restarts the service after WatchdogSec=."""
    return notify("WATCHDOG=1") if watchdog_enabled() else False
