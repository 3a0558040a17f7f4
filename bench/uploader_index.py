"""What the uploader costs the store's index: commits per uploaded file, and part notes.

    python bench/uploader_index.py [--tree PATH] [--files 200] [--parts 1280 4000]

1. commits: N committed 64 KiB files uploaded 8 at a time to an in-process S3
   (testkit/fakes3): the index write txns (each an LMDB commit, an fdatasync under the
   index lock every client's batch waits for) and env syncs the drain costs, and its wall time.
2. notes: one file of P parts of 1 KiB uploaded the same way: how often it notes its parts
   (each note rewrites the file's object record) and the upload's CPU seconds.
--tree: measure that checkout's code (an older commit), so two commits compare side by side.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ap.add_argument("--files", type=int, default=200)
ap.add_argument("--parts", type=int, nargs="*", default=[1280, 4000])
args = ap.parse_args()
sys.path.insert(0, os.path.abspath(args.tree))

import structlog  # noqa: E402

import cache.index as index_mod  # noqa: E402
from cache.store import Store  # noqa: E402
from testkit.fakes3 import FakeS3  # noqa: E402
from testkit.storefiles import write_file  # noqa: E402
from uploader.service import Uploader  # noqa: E402
from uploader.settings import UploadSettings  # noqa: E402

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
write_txns = 0
_write = index_mod.Index.write


@contextlib.contextmanager
def _counted_write(self):
    global write_txns
    write_txns += 1
    with _write(self) as w:
        yield w


index_mod.Index.write = _counted_write


def drain(store: Store, settings: UploadSettings) -> tuple[float, float]:
    """Upload everything queued; (wall s, CPU s of this process)."""
    async def run():
        up = Uploader(store, FakeS3(), settings, prefix="")
        await up.start()
        t0, c0 = time.monotonic(), time.process_time()
        try:
            assert await up.flush(timeout=600)
        finally:
            await up.stop()
        return time.monotonic() - t0, time.process_time() - c0
    return asyncio.run(run())


def commits(files: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        store = Store.open(d, capacity=1 << 30)
        try:
            for i in range(files):
                write_file(store, f"f{i}", os.urandom(65536))
            store.sync()
            txns, syncs = write_txns, store.committer.syncs
            wall, _ = drain(store, UploadSettings(settle_seconds=0, poll_interval=0.01, max_concurrency=8))
            return {"files": files, "index_write_txns": write_txns - txns,
                    "env_syncs": store.committer.syncs - syncs, "wall_s": round(wall, 2)}
        finally:
            store.close()


def notes(parts: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        store = Store.open(d, capacity=1 << 30)
        try:
            write_file(store, "big", os.urandom(parts * 1024))
            count = [0]
            note = getattr(store, "note_parts", None)
            if note is not None:         # older trees recorded parts with set_remote_info only
                store.note_parts = lambda *a: (count.__setitem__(0, count[0] + 1), note(*a))
            settings = UploadSettings(settle_seconds=0, poll_interval=0.01, part_size_min=1024,
                                      multipart_threshold=1024, allow_small_parts=True)
            wall, cpu = drain(store, settings)
            return {"parts": parts, "notes": count[0] if note is not None else None,
                    "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}
        finally:
            store.close()


if __name__ == "__main__":
    print({"tree": args.tree, "commits": commits(args.files), "notes": [notes(p) for p in args.parts]})
