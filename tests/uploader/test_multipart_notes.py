"""A multipart upload's notes of the parts it has sent (the hints a resume starts from)."""
import asyncio
import os
import time

from testkit.fakes3 import FakeS3
from testkit.storefiles import write_file
from uploader.service import Uploader
from uploader.settings import UploadSettings
from uploader.worker import NOTE_INTERVAL, NOTES_PER_UPLOAD, note_due


def test_note_due_after_every_part_of_a_small_upload_and_a_bounded_number_of_a_large_one():
    assert all(note_due(1, total, 0.0) for total in (1, 12, NOTES_PER_UPLOAD * 2 - 1))
    every = 10_000 // NOTES_PER_UPLOAD
    assert not note_due(every - 1, 10_000, 0.0) and note_due(every, 10_000, 0.0)
    assert note_due(1, 10_000, NOTE_INTERVAL)          # a slow upload still notes its progress


def test_a_large_multipart_upload_notes_its_parts_a_bounded_number_of_times(store):
    # a note rewrites the file's whole record: one per part made an upload O(parts^2), and
    # held the index lock (every client waiting) ~20 ms per part at 10k parts
    nparts = 20 * NOTES_PER_UPLOAD
    data = os.urandom(nparts * 1024)
    write_file(store, "big.bin", data)
    notes = []
    note_parts = store.note_parts

    def counting(ino, upload_id, parts):
        notes.append(len(parts))
        note_parts(ino, upload_id, parts)
    store.note_parts = counting
    fake = FakeS3()
    settings = UploadSettings(settle_seconds=0, part_size_min=1024, multipart_threshold=1024,
                              allow_small_parts=True, poll_interval=0.01)

    async def run() -> float:
        up = Uploader(store, fake, settings, prefix="")
        await up.start()
        t0 = time.monotonic()
        try:
            assert await up.flush(timeout=120)
        finally:
            await up.stop()
        return time.monotonic() - t0

    took = asyncio.run(run())
    assert fake.current("big.bin").data == data
    assert notes == sorted(notes) and notes[-1] == nparts
    assert NOTES_PER_UPLOAD <= len(notes) <= NOTES_PER_UPLOAD + took / NOTE_INTERVAL + 1
