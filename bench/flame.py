"""Profiles for the report: py-spy samples a running gateway, and the collapsed stacks become a
per-thread busy share, a table of the functions the samples sit in, and a flame graph (SVG: its frame names stay text, searchable and sharp at any zoom).

py-spy (the `bench` extra) attaches to the process by pid with `--nonblocking` (it reads the
target's memory without pausing it, so the profile does not slow what it measures) and writes
"raw" collapsed stacks: one line per distinct stack, `thread;frame;frame count`, root first.
Samples py-spy judges idle are left out (no `--idle`), so a thread's share of samples over the time
it was watched is how busy it was; without pausing the process py-spy misjudges some waits
(`select`, `Condition.wait`) as running, and the report says so.
"""
from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

RATE = 100                  # samples per second and thread
TOP = 12                    # rows of the "where the samples are" table
MIN_SHARE = 0.005           # flame graph: frames under this share of all samples are not drawn


def py_spy() -> str | None:
    """The py-spy executable next to this interpreter's or on PATH; None if missing."""
    import sys
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


@contextmanager
def sampling(pid: int, out: Path):
    """py-spy records every thread of `pid` into `out` while the block runs; yields
    a dict whose "seconds" is set to how long it watched."""
    exe = py_spy()
    if exe is None:
        from .record import NotRunHere
        raise NotRunHere("py-spy is not installed (pip install -e '.[bench]')")
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", str(RATE), "--format", "raw",
                             "--threads", "--nonblocking", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watched: dict = {}
    time.sleep(0.5)                           # attached before the load starts
    t0 = time.monotonic()
    try:
        yield watched
    finally:
        watched["seconds"] = time.monotonic() - t0
        proc.send_signal(signal.SIGINT)       # py-spy writes its output on SIGINT
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode not in (0, -signal.SIGINT) or not out.exists():
            raise RuntimeError(f"py-spy failed ({proc.returncode}): {err.decode(errors='replace')[-300:]}")


def read_stacks(path: Path) -> dict[tuple[str, ...], int]:
    """Collapsed stacks: (thread, outermost frame, ..., innermost frame) -> samples."""
    out: dict[tuple[str, ...], int] = collections.Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            out[tuple(stack.split(";"))] += int(n)
    return dict(out)


def _thread_name(root: str) -> str:
    """'thread (1234): ckptgw-nsbatch' -> 'ckptgw-nsbatch'; pools' numbered threads as one."""
    name = root.split(": ", 1)[1] if ": " in root else root
    return name.rstrip("0123456789").rstrip("_-") or name


def _frame(f: str) -> str:
    """'Store.write (cache/store.py:654)' -> 'Store.write (cache/store.py)': lines apart, one box."""
    name, _, where = f.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def summary(stacks: dict[tuple[str, ...], int], seconds: float) -> dict:
    """Busy share per thread (samples / (rate x seconds watched)), and the TOP innermost
    frames by samples, with their share of all samples."""
    total = sum(stacks.values()) or 1
    threads: dict[str, int] = collections.Counter()
    counts: dict[str, int] = collections.Counter()
    for stack, n in stacks.items():
        threads[_thread_name(stack[0])] += n
        counts[_frame(stack[-1]) if len(stack) > 1 else stack[0]] += n
    per_thread = {}
    for name, n in threads.most_common():
        members = len({s[0] for s in stacks if _thread_name(s[0]) == name})
        per_thread[name] = {"threads": members, "busy": n / (RATE * max(seconds, 1e-9))}
    return {"samples": total, "seconds": seconds, "threads": per_thread,
            "top": [(f, n / total) for f, n in counts.most_common(TOP)]}


def _tree(stacks: dict[tuple[str, ...], int]) -> dict:
    root: dict = {"n": 0, "kids": {}}
    for stack, n in stacks.items():
        node = root
        node["n"] += n
        for f in (_thread_name(stack[0]),) + tuple(_frame(x) for x in stack[1:]):
            node = node["kids"].setdefault(f, {"n": 0, "kids": {}})
            node["n"] += n
    return root


def plot(stacks: dict[tuple[str, ...], int], title: str, out: Path) -> None:
    """A flame graph: one box per frame, as wide as its samples, callers below callees,
    threads (pools merged) side by side at the bottom; frames narrower than MIN_SHARE are left out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root = _tree(stacks)
    total = root["n"] or 1
    boxes = []                               # (x, depth, width, label)
    todo = [(root, 0.0, -1)]
    while todo:
        node, x, depth = todo.pop()
        for name, kid in sorted(node["kids"].items(), key=lambda kv: -kv[1]["n"]):
            w = kid["n"] / total
            if w >= MIN_SHARE:
                boxes.append((x, depth + 1, w, name))
                todo.append((kid, x, depth + 1))
            x += w
    depth = max((b[1] for b in boxes), default=0) + 1
    fig, ax = plt.subplots(figsize=(16, max(3.0, 0.22 * depth + 1)))
    for x, d, w, name in boxes:
        ax.add_patch(plt.Rectangle((x, d), w, 0.95, color=plt.cm.YlOrRd(0.25 + 0.5 * (zlib.crc32(name.encode()) % 97) / 97),
                                   lw=0.3, ec="white"))
        if w > 0.02:
            ax.text(x + 0.002, d + 0.45, name[:int(w * 230)], fontsize=5.5, va="center", clip_on=True)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, depth)
    ax.set_yticks([])
    ax.set_xlabel("share of samples (all threads; frames under %.1f%% not drawn)" % (100 * MIN_SHARE))
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out)                     # the format from out's suffix: .svg in the report
    plt.close(fig)
