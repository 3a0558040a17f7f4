"""Per-process cost from /proc: CPU seconds (utime + stime of every thread), RSS sampled over
time, and niceness. Linux only; pids are the benchmark's own children."""
from __future__ import annotations

import os
import threading
import time

_TICKS = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """pid and its live descendants (a gateway that forks workers is measured as a whole)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def _own_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()      # after "(comm)", fields start at #3 (state)
    # #14 utime, #15 stime (all threads), #16 cutime, #17 cstime (children already reaped)
    return sum(int(x) for x in fields[11:15]) / _TICKS


def _tree_sum(pid: int, own):
    """own(pid) plus own(d) for each live descendant d (one that exits meanwhile counts 0)."""
    total = own(pid)
    for p in tree(pid)[1:]:
        try:
            total += own(p)
        except FileNotFoundError:
            pass
    return total


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of pid, its live descendants and its reaped children."""
    return _tree_sum(pid, _own_cpu)


def _own_user(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[13])) / _TICKS      # #14 utime, #16 cutime


def user_seconds(pid: int) -> float:
    """User CPU seconds of pid, its live descendants and its reaped children."""
    return _tree_sum(pid, _own_user)


def _own_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes(pid: int) -> int:
    """Resident bytes of pid and its live descendants (shared pages counted in each)."""
    return _tree_sum(pid, _own_rss)


def renice_all(pid: int, nice: int) -> None:
    """Set the niceness of every thread of pid (Linux nice is per thread; threads created later
    inherit it from their creator, so the main thread's counts for the future)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except ProcessLookupError:
            pass


def quiesce_disk() -> None:
    """Write back every dirty page before a side of a comparison starts: otherwise the side
    that runs after a heavy writer (the previous side's GiBs still in the page cache) pays for
    that writeback in its own fdatasyncs, and the order of the sides, not the servers, decides."""
    os.sync()


def idle_all(pid: int) -> None:
    """SCHED_IDLE for every thread of pid: it runs only on CPU time no other task wants, and
    a waking task of any other policy preempts it at once (nice 19 still has a weight, and a
    wake-up may wait for its slice). Threads created later inherit their creator's policy."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:
            pass


class CpuMeter:
    """CPU seconds each named process spent between start() and stop()."""

    def __init__(self, pids: dict[str, int]):
        self.pids = dict(pids)
        self._t0: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        self.wall = 0.0

    def start(self) -> "CpuMeter":
        self._t0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._wall0 = time.perf_counter()
        return self

    def stop(self) -> dict[str, float]:
        self.wall = time.perf_counter() - self._wall0
        for name, pid in self.pids.items():
            try:
                self.seconds[name] = cpu_seconds(pid) - self._t0[name]
            except FileNotFoundError:            # exited: its cost until then is unknown
                self.seconds[name] = float("nan")
        return self.seconds


class RssSampler:
    """A daemon thread sampling a process's RSS every `interval` seconds: samples = [(t, bytes)]."""

    def __init__(self, pid: int, interval: float = 0.25):
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic() - t0, rss_bytes(self.pid)))
            except FileNotFoundError:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def peak(self) -> int:
        return max((b for _, b in self.samples), default=0)
