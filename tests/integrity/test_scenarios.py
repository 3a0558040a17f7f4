"""Named regression scenarios of issue 13, replayed step by step through the simulation
(tests/integrity/sim.py) with every invariant checked after each step. Those today's code
fails are xfail(strict=True): the lead removes the marker when the fix merges."""
from __future__ import annotations

import time

import pytest

from tests.integrity.sim import Sim
from uploader.jobs import UPLOAD

HOUR_NS = 3600 * 10**9


@pytest.fixture
def sim():
    s = Sim(seed=13)
    yield s
    s.close()


def step_all(s: Sim, limit: int = 500) -> None:
    """Grant every held request one by one, checking the invariants after each; fails when
    it gives up with requests still pending (a scenario that never settles is a finding,
    not a pass)."""
    for _ in range(limit):
        if not s.pending:
            return
        s.grant(s.pending[0])
        s.check()
    assert not s.pending, f"step_all gave up after {limit} grants with {len(s.pending)} pending"


def grant_until(s: Sim, op: str, limit: int = 20, what: str | None = None) -> None:
    """Grant held requests one by one, checking the invariants after each, until the next one
    is `op` (on key `what`, if given) (held: a kill can come right before it); fails if it
    never comes."""
    def due() -> bool:
        return bool(s.pending) and s.pending[0].op == op and what in (None, s.pending[0].what)
    for _ in range(limit):
        if not s.pending or due():
            break
        s.grant(s.pending[0])
        s.check()
    assert due(), f"no {op} came: {[(p.op, p.what) for p in s.pending]}"


def step_outage(s: Sim, grants: int = 50) -> None:
    """Grant held requests while S3 is out, checking the invariants after each: every one
    fails and its job retries, so requests stay pending (an outage never settles; step_all
    would give up, rightly)."""
    for _ in range(grants):
        assert s.pending, "a job stopped retrying during the outage"
        s.grant(s.pending[0])
        s.check()
    assert s.pending


def test_step_all_fails_when_it_gives_up_with_requests_pending():
    class Endless:                   # every grant holds a new request: it never settles
        pending = ["req"]

        def grant(self, req):
            pass

        def check(self):
            pass
    with pytest.raises(AssertionError, match="pending"):
        step_all(Endless(), limit=3)
    settled = Endless()
    settled.pending = []
    step_all(settled)                # nothing pending: returns


def test_dir_moved_away_and_file_moved_back_during_outage(sim):
    sim.mkdir("d")
    sim.save("d/f", sim.payload(3000))
    sim.drain()
    sim.check_drained()
    sim.set_faults(outage=True)
    sim.rename("d", "e")
    sim.mkdir("d")
    sim.rename("e/f", "d/f")
    sim.enqueue(flush=True)
    sim.dispatch()
    step_outage(sim)
    sim.check()
    sim.drain()
    sim.check_drained()


def test_tmp_renamed_over_uploaded_latest_keeps_old_or_new(sim):
    sim.save("latest.pt", sim.payload(2000))
    sim.drain()
    sim.check()                      # latest.pt is now a path S3 must keep an object at
    sim.save("latest.pt.tmp", sim.payload(2500))
    sim.rename("latest.pt.tmp", "latest.pt")
    for _ in range(5):
        sim.enqueue(flush=False)
        sim.dispatch()
        step_all(sim)
        sim.check()
    sim.drain()
    sim.check_drained()


def test_tmp_written_again_after_its_upload_then_renamed_never_puts_old_bytes_at_the_new_name(sim):
    """Found by tests/ha (issue 38): a tmp file uploaded, written again, renamed to its final name;
    the rename's move copied the old object there (invariant 6), until the re-upload replaced it."""
    sim.save("latest.pt.tmp", sim.payload(2000))
    sim.drain()
    sim.check()
    sim.save("latest.pt.tmp", sim.payload(2500))
    sim.rename("latest.pt.tmp", "latest.pt")
    sim.enqueue(flush=False)                 # the move, not the upload (inside its settle window)
    sim.dispatch()
    step_all(sim)
    sim.check()
    sim.drain()
    sim.check_drained()


def test_file_changed_after_its_upload_then_its_directory_renamed_never_puts_old_bytes_at_the_new_name(sim):
    """Found by the model (long mode, seed 20261128) right after invariant 6 came: the directory
    move copied a file's object that the file had since truncated; the same rule as a file move."""
    sim.mkdir("d")
    sim.save("d/a", sim.payload(1))
    sim.drain()
    sim.check()
    sim.truncate("d/a", 0)
    sim.rename("d", "a")
    sim.drain()
    sim.check_drained()


def test_file_written_again_renamed_then_removed_before_its_move_never_puts_old_bytes_at_the_new_name(sim):
    """Found by the model (long mode, seed 20261128) after the two above: the file was gone when its
    move ran, so the move could not tell its bytes had moved on, and copied the old object to the
    new name for the unlink's job to remove. A gone file's move now removes its object instead."""
    sim.save("latest.pt", sim.payload(2000))
    sim.drain()
    sim.check()
    sim.write("latest.pt", 0, sim.payload(10))
    sim.rename("latest.pt", "a")
    sim.remove("a")
    sim.drain()
    sim.check_drained()


def test_name_holding_a_hard_linked_files_object_removed_after_a_write_never_moves_old_bytes(sim):
    """Found by the model (long mode, seed 20261128): a file's object sat at one of its names; the
    file was written again and that name removed; the unlink's move of the object to the next name
    copied the old bytes there. The object now stays until the file's upload drops it."""
    sim.save("a", sim.payload(2000))
    sim.drain()
    sim.check()
    sim.write("a", 0, sim.payload(10))
    sim.link("a", "b")
    sim.remove("a")
    sim.drain()
    sim.check_drained()


def test_new_empty_file_at_the_old_name_of_a_removed_empty_file_keeps_its_object(sim):
    """Found by the model (long mode, seed 20261128), failing since before b674b78: an empty temp
    file uploaded, linked, renamed and removed under both names; a new empty file created at its old
    name and uploaded; the old file's jobs delete by ETag, and the new file's object has the same one
    (both empty): S3 lost the new file's object while the store called it CLEAN. A file whose own
    object sits at the name is never handed an older object there to delete (adopt_replaced)."""
    sim.create("a")
    for _ in range(6):
        sim.dispatch()
    sim.create("latest.pt.tmp")
    sim.remove("a")
    sim.drain()
    sim.link("latest.pt.tmp", "a")
    sim.rename("latest.pt.tmp", "latest.pt")
    for _ in range(3):
        sim.dispatch()
    sim.remove("a")
    sim.remove("latest.pt")
    sim.create("latest.pt.tmp")
    sim.drain()
    sim.check_drained()


def test_mtime_an_hour_ahead_is_uploaded(sim):
    sim.save("f", sim.payload(1000))
    sim.set_mtime("f", time.time_ns() + HOUR_NS)
    sim.drain()
    sim.check_drained()


def test_temp_file_with_old_mtime_waits_its_settle_window(sim):
    sim.save("latest.pt.tmp", sim.payload(1000))
    sim.set_mtime("latest.pt.tmp", time.time_ns() - 24 * HOUR_NS)     # cp -p, rsync -t
    sim.enqueue(flush=False)
    sim.dispatch()
    step_all(sim)
    sim.rename("latest.pt.tmp", "latest.pt")
    sim.drain()
    sim.check_drained()
    assert not any(k.endswith(".tmp") for k in sim.fake.history), sorted(sim.fake.history)


def test_mkdir_of_temp_dir_puts_no_marker(sim):
    sim.mkdir("step_000100.tmp")
    sim.dispatch()
    step_all(sim)
    sim.check()
    assert not sim.fake.ever_held("step_000100.tmp/")


def test_import_then_delete_removes_object(sim):
    sim.import_external("x.pt", sim.payload(800))
    assert sim.node("x.pt") is not None
    sim.remove("x.pt")
    sim.drain()
    sim.check_drained()


def test_readthrough_of_evicted_file_renamed_over_is_never_spliced(sim):
    sim.save("latest.pt", sim.payload(3000))
    sim.drain()
    sim.evict("latest.pt")
    sim.rename("latest.pt", "old.pt")            # the evicted file moves away (job pending)
    sim.save("new.pt", sim.payload(3000))
    sim.drain()                                  # ... the new one is uploaded too
    sim.rename("old.pt", "keep.pt")
    sim.rename("new.pt", "old.pt")               # and a new checkpoint takes its old name
    sim.set_faults(outage=True)
    sim.enqueue(flush=True)
    sim.set_faults()
    sim.read_through("keep.pt")                  # Violation on spliced bytes
    sim.check()
    sim.drain()
    sim.check_drained()


def test_rewrite_during_multipart_upload_is_never_torn(sim):
    sim.save("big.pt", sim.payload(6000))        # 6 parts of 1 KiB
    sim.enqueue(flush=True)
    sim.dispatch()
    for _ in range(4):                           # create + a few parts
        parts = [p for p in sim.pending if p.op != "ListMultipartUploads"]
        if parts:
            sim.grant(parts[0])
            sim.check()
    sim.write("big.pt", 0, sim.payload(6000))    # the whole file rewritten mid-upload
    sim.commit("big.pt")
    step_all(sim)
    sim.check()                                  # Violation on a torn object
    sim.drain()
    sim.check_drained()


def test_imported_file_renamed_over_local_then_imported_again_keeps_its_object(sim):
    """Found by the model: an imported file renamed over an uploaded local one, and a second
    import while the move is still queued. The second import brought the imported object in
    again under its old name; the move then deleted it, leaving that new file CLEAN with no
    object. Import now skips keys the gateway still answers for (Store.owned_keys)."""
    sim.save("latest.pt", sim.payload(500))
    sim.drain()
    sim.check_drained()
    sim.import_external("z", sim.payload(300))
    sim.rename("z", "latest.pt")                 # the move z -> latest.pt waits in the queue
    sim.check()
    sim.import_external("imp/x", sim.payload(10))
    assert sim.node("z") is None, "the object being moved was imported again"
    sim.check()
    sim.drain()
    sim.check_drained()


def test_import_makes_parent_directories_with_markers(sim):
    """Found by the model: the directories import creates for a key's parents had no marker
    in S3, so after the key went the bucket lost the directory."""
    sim.import_external("imp/x", sim.payload(10))
    sim.drain()
    sim.check_drained()
    sim.remove("imp/x")
    sim.drain()
    sim.check_drained()


@pytest.mark.parametrize("imported", [True, False])
def test_hard_link_at_a_deleted_files_name_does_not_keep_its_object(sim, imported):
    """Found by the model: an uploaded file removed, and a hard link to another (imported or
    uploaded) file made at its name before the delete ran. The delete handed the old object
    to the linked file as one its upload would replace, but a hard-linked file's object lives
    under its first name: the old bytes stayed at the name for ever."""
    sim.save("a", sim.payload(4000))
    if imported:
        sim.import_external("z", sim.payload(1300))
    else:
        sim.save("z", sim.payload(1300))
    sim.drain()
    sim.check_drained()
    sim.remove("a")                              # its delete waits in the queue
    sim.link("z", "a")
    sim.check()
    sim.drain()
    sim.check_drained()


def test_upload_changed_while_queued_is_uploaded_by_the_drain(sim):
    """Found by the model: an upload job whose file was written after it was queued ends
    'changed' and leaves the file DIRTY; a drain (flush --wait) goes on until it is in."""
    sim.save("a", sim.payload(300))
    sim.enqueue(flush=True)
    sim.write("a", 100, sim.payload(50))
    sim.drain()
    sim.check_drained()


def test_upload_of_imported_file_during_outage_retries_quietly(sim):
    """Found by the model: an imported file written in part is uploaded with its old bytes
    fetched first; in an outage that bounded fetch gives up with a transient error, which
    the job logged as an unexpected failure. It is a retry like any other S3 outage."""
    sim.import_external("z", sim.payload(2000))
    sim.write("z", 0, sim.payload(100))
    sim.commit("z")
    sim.set_faults(outage=True)
    sim.enqueue(flush=True)
    sim.dispatch()
    step_outage(sim)                             # Violation on job_failed
    sim.check()
    sim.drain()
    sim.check_drained()


@pytest.mark.parametrize("imported", [True, False])
def test_file_renamed_then_removed_before_its_move_leaves_no_object(sim, imported):
    """Found by the model: an imported file renamed and removed before the move ran. The
    move no longer found the record (reclaimed) and an imported object carries no identity
    of ours, so it was 'not ours'; the delete looked only at the new name: the object stayed
    under the old name for ever."""
    if imported:
        sim.import_external("z", sim.payload(10))
    else:
        sim.save("z", sim.payload(10))
        sim.drain()
    sim.rename("z", "a")
    sim.remove("a")
    sim.drain()
    sim.check_drained()


def test_hard_link_that_becomes_the_first_name_leaves_one_object(sim):
    """Found by the model: an imported file hard-linked under a name that sorts first, then
    written: its upload goes to that name (path_of), and the old object stayed under the
    other name with the old bytes for ever. A file has one object: the old one goes."""
    sim.import_external("z", sim.payload(100))
    sim.link("z", "a")
    sim.write("a", 50, sim.payload(100))
    sim.commit("a")
    sim.drain()
    sim.check_drained()



def test_first_name_removed_then_link_evicted_uploads_under_the_link(sim):
    """Found by the model: a clean file's first name removed (the link it keeps becomes its
    only name, uploaded again there), then evicted before that upload ran: the upload must
    finish (reading its bytes back from the old object), not stay UPLOADING for ever."""
    sim.save("a", sim.payload(1))
    sim.drain()
    sim.link("a", "latest.pt")
    sim.remove("a")
    sim.evict("latest.pt")
    sim.drain()
    sim.check_drained()


@pytest.mark.parametrize("imported", [True, False])
def test_first_name_removed_move_killed_before_the_old_object_goes(sim, imported):
    """The move of a removed first name's object to the file's other link, killed after the
    copy and the re-key, before the old object went: the replay must still remove exactly
    that object (an imported one carries no identity of ours, only the journal's ETag)."""
    if imported:
        sim.import_external("z", sim.payload(10))
    else:
        sim.save("z", sim.payload(10))
        sim.drain()
    sim.link("z", "latest.pt")
    sim.remove("z")
    sim.evict("latest.pt")
    sim.enqueue(flush=True)
    sim.dispatch()
    grant_until(sim, "DeleteObject")
    sim.kill9()
    sim.check()
    sim.drain()
    sim.check_drained()


@pytest.mark.parametrize("size", [0, 10])
def test_imported_file_renamed_move_killed_after_the_rekey_removes_the_old_object(sim, size):
    """Found by the model's long run (2026-11-28, seed 20261128, ~190,000 steps): `mv imp/x
    imp/a` of an imported file, the move killed after the copy and the durable re-key, before
    the old object went. The replay found the record already at imp/a and looked for an
    object of ours at imp/x by its identity metadata, which an imported object does not
    carry: imp/x stayed in S3 forever. The job now records the object it copies (key and
    ETag) before the copy, and the replay removes exactly that one."""
    sim.import_external("imp/x", sim.payload(size))
    sim.rename("imp/x", "imp/a")
    sim.check()
    sim.dispatch()
    grant_until(sim, "DeleteObject")
    sim.kill9()
    sim.check()
    sim.drain()
    sim.check_drained()


@pytest.mark.parametrize("size", [0, 10])
def test_imported_file_renamed_twice_and_removed_while_its_move_runs_leaves_no_object(sim, size):
    """Found by the model's long run (2026-11-28, seed 20261128, rerun after the fix above):
    `mv z a; mv a d` of an imported file, the first move started, then `rm d` (the inode and its
    record go) before the copy. The move copied z to a and found no record to re-key; the next
    move could not tell the copy at a was its file's (an imported object has no identity of
    ours) and the unlink looked at d: a stayed in S3 for ever. A move whose file went while it
    copied now removes its copy; the unlink's job removes the source it recorded."""
    sim.dispatch()
    sim.import_external("z", sim.payload(size))
    sim.rename("z", "a")
    sim.rename("a", "d")
    sim.dispatch()                       # the first move begins (its HEAD held)
    sim.remove("d")
    sim.check()
    sim.drain()
    sim.check_drained()


def test_imported_file_moved_killed_then_removed_leaves_no_object(sim):
    """The replay of that move: `mv z a` of an imported file copied and re-keyed, killed before
    z went; after the restart `rm a` (the unlink records the copy at a, the inode goes). The
    replay finds no record; by the ETag the move's job recorded before its copy, neither z nor
    the copy at a is left (they carry no identity of ours for any later job to find)."""
    sim.import_external("z", sim.payload(10))
    sim.rename("z", "a")
    sim.dispatch()
    grant_until(sim, "DeleteObject")
    sim.kill9()
    sim.check()
    sim.remove("a")
    sim.drain()
    sim.check_drained()


def test_first_name_renamed_over_then_link_evicted_keeps_both(sim):
    """`mv b a` over the name holding a hard-linked file's object, the file then evicted:
    its object moves to its other link, and `a` keeps the old object until b's lands."""
    sim.save("a", sim.payload(1))
    sim.drain()
    sim.link("a", "latest.pt")
    sim.save("b", sim.payload(2))
    sim.rename("b", "a")
    sim.evict("latest.pt")
    sim.enqueue(flush=True)
    sim.dispatch()
    step_all(sim)
    sim.drain()
    sim.check_drained()

def test_object_name_removed_while_the_file_is_dirty_keeps_its_object_findable(sim):
    """Found by the long model run (a check of the sim, not the gateway): a hard-linked
    file's name holding its object removed while other names keep the file: until the queued
    move runs, the object is at the removed name, where the record says, exactly as during a
    queued rename. The 'a name keeps a good object' check now looks where the gateway finds
    the file's object (as the CLEAN check does); the drain ends with one object at b."""
    sim.import_external("imp/y.pt", sim.payload(293))
    sim.read_through("imp/y.pt")         # read back: CLEAN, and imp/y.pt holds a good object
    sim.check()
    sim.link("imp/y.pt", "a")
    sim.write("a", 0, sim.payload(10))
    sim.commit("a")
    sim.drain()
    sim.check_drained()
    sim.link("a", "b")
    sim.write("b", 5, sim.payload(20))
    sim.remove("a")
    sim.check()
    sim.drain()
    sim.check_drained()


def test_upload_to_a_hard_link_racing_the_move_of_its_old_object_leaves_one_object(sim):
    """Found by the long model run: an imported file renamed (its object's move queued),
    hard-linked under a name that sorts first and written there, renamed again: its upload
    to the first name ran alongside the moves of its old object, dropped the object at the
    name it had read from the record while a move put it at the next one: the old bytes
    stayed under a name of the file for ever. An upload now waits for its file's moves."""
    sim.import_external("imp/y.pt", sim.payload(371))
    sim.read_through("imp/y.pt")
    sim.rename("imp/y.pt", "imp/step.tmp")
    sim.link("imp/step.tmp", "imp/a")
    sim.truncate("imp/a", 5506)
    sim.rename("imp/a", "e")
    sim.rename("imp/step.tmp", "imp/latest.pt.tmp")
    sim.enqueue(flush=True)
    sim.dispatch()
    step_all(sim)
    sim.drain()
    sim.check_drained()


def test_imported_file_removed_after_its_directory_moved_leaves_no_object(sim):
    """Found by the long model run: an imported file's directory renamed, then the file
    removed before the directory's move ran. The move brought the object to the new name
    (the record, reclaimed, no longer pointed at it), and an imported object carries no
    identity of ours: the unlink left it there for ever. The unlink now also recognises the
    object the journal recorded by its ETag, which a server-side copy keeps."""
    sim.import_external("imp/x", sim.payload(0))
    sim.rename("imp", "a")
    sim.remove("a/x")
    sim.drain()
    sim.check_drained()


def test_import_into_the_old_name_of_a_moved_directory_keeps_its_object(sim):
    """Found by the long model run: imp/ renamed to a/ while its move is queued, then an
    import brings a new imp/y.pt in: the queued move took its object to a/y.pt, leaving the
    new file with none. A move now leaves the object of a file imported after it was queued."""
    sim.import_external("imp/x", sim.payload(0))
    sim.rename("imp", "a")
    sim.import_external("imp/y.pt", sim.payload(0))
    sim.drain()
    sim.check_drained()



def test_hard_link_renamed_over_an_uploaded_file_does_not_keep_its_object_forever(sim):
    """Found by the long model run: a clean file's second link renamed over an uploaded file
    (`ln latest.pt latest.pt.tmp; mv latest.pt.tmp a`). The replaced object at `a` was kept
    for a queued rename to replace, but that rename moves nothing (the file's object stays
    at its first name, latest.pt), so `a` kept the old file's bytes after every drain. Kept
    objects are now handed only to a move the file's object really takes."""
    sim.import_external("imp/x", sim.payload(2218))
    sim.create("latest.pt")
    sim.rename("imp/x", "a")
    sim.drain()
    sim.link("latest.pt", "latest.pt.tmp")
    sim.rename("latest.pt.tmp", "a")
    sim.drain()
    sim.check_drained()


def test_object_put_under_the_old_name_of_a_moved_directory_and_not_imported_stays(sim):
    """Found by the long model run once the move left imported files alone: an object put
    into imp/ by somebody else after `mv imp a`, whose import failed (S3 down), was taken to
    a/y.pt by the queued move. Not imported, it is no file of the namespace and not ours to
    move: it stays where its writer put it, for a later import to bring in."""
    sim.import_external("z", sim.payload(0))
    sim.import_external("imp/x", sim.payload(0))
    sim.rename("imp", "a")
    sim.set_faults(outage=True)
    sim.import_external("imp/y.pt", sim.payload(0))
    sim.drain()
    sim.check_drained()


def test_import_while_a_directory_move_is_queued_leaves_the_objects_being_moved(sim):
    """Found by the long model run: `mv imp d` queued, then an import (of anything): the
    objects still under imp/ that the move is about to take - here a symlink of ours, which
    has no record, and the directory's marker - were imported again as new names, and the
    move left d/a without its object. Import never takes an object this store wrote: the
    gateway already answers for it (a queued move or delete)."""
    sim.mkdir("imp")
    sim.symlink("imp/a", b"a")
    sim.drain()
    sim.rename("imp", "d")
    sim.import_external("z", sim.payload(0))
    sim.drain()
    sim.check_drained()


def test_object_put_at_a_name_a_queued_unlink_still_names_is_not_imported_yet(sim):
    """Found by the long model run (a check of the sim): a hard-linked imported file renamed
    (its object moved from imp/x to imp/a) and its other name removed; the unlink job, still
    queued, names the object it recorded at imp/x. Somebody puts a new object at imp/x: import
    skips it (the gateway answers for that key until the job is done) and the bucket keeps it
    as an unimported object - allowed, a later import brings it in - never as the gateway's."""
    for _ in range(7):
        sim.dispatch()
    sim.mkdir("d")
    sim.import_external("imp/x", sim.payload(0))
    sim.link("imp/x", "a")
    sim.create("d/a")
    for _ in range(4):
        sim.dispatch()
    sim.rename("imp/x", "imp/a")
    sim.rename("a", "latest.pt")
    sim.dispatch()
    sim.remove("latest.pt")
    sim.grant_job(4)                               # the rename's move, imp/x -> imp/a, runs first
    sim.import_external("imp/x", sim.payload(0))
    assert sim.node("imp/x") is None               # not imported while the unlink is queued
    sim.drain()
    sim.check_drained()
    sim.import_external("z", sim.payload(1))       # the queue is empty: now it is
    assert sim.node("imp/x") is not None


def test_file_renamed_over_a_link_whose_object_moved_to_the_first_name(sim):
    """Found by the long model run (a check of the sim): a file uploaded as latest.pt.tmp,
    renamed to step.tmp and linked back as latest.pt.tmp; its object moved to step.tmp, so
    latest.pt.tmp held none. Another file renamed over latest.pt.tmp then has no old object
    there to keep: the sim still counted the name as holding one."""
    sim.save("latest.pt.tmp", sim.payload(0))
    sim.drain()
    sim.rename("latest.pt.tmp", "step.tmp")
    sim.link("step.tmp", "a")
    sim.rename("a", "d")
    sim.link("step.tmp", "latest.pt.tmp")
    sim.check()                        # the link names the object still at latest.pt.tmp
    sim.drain()                        # which the rename's job moves to step.tmp
    sim.check_drained()
    sim.save("a", sim.payload(0))
    sim.rename("a", "d")
    sim.write("step.tmp", 0, sim.payload(1))
    sim.rename("d", "latest.pt.tmp")
    sim.check()
    sim.drain()
    sim.check_drained()

def test_directory_renamed_to_a_temporary_name_moves_no_marker_there(sim):
    """Found by the long model run: a directory with its marker in S3 renamed to a temporary
    name; the move copied the marker too, so a temporary directory's marker reached S3
    outside any flush of it. The move now only drops the old marker (a later rename to a
    final name puts one there)."""
    sim.mkdir("e")
    sim.drain()
    sim.rename("e", "latest.pt.tmp")
    sim.enqueue(flush=False)
    sim.dispatch()
    step_all(sim)
    sim.check()
    sim.rename("latest.pt.tmp", "f")
    sim.drain()
    sim.check_drained()


def test_directory_moved_out_of_a_temporary_name_gets_the_markers_of_its_subdirectories(sim):
    """Found by the model: an imported directory moved into a temporary one and then the
    temporary one renamed to its final name (`mv imp step.tmp/a; mv step.tmp a`): the marker
    of `a/a/` was dropped on the way in (no marker under a temporary name) and never put on
    the way out, so after a drain S3 lacked a directory the namespace has."""
    sim.import_external("imp/x", sim.payload(0))
    sim.drain()
    sim.mkdir("step.tmp")
    sim.rename("imp", "step.tmp/a")
    sim.rename("step.tmp", "a")
    sim.drain()
    sim.check_drained()


def test_file_renamed_over_a_symlink_that_replaced_an_uploaded_file(sim):
    """Model bug, found by the long run of 2026-11-25 (seed 20261125): the path kept the
    promise "S3 holds a good object here while it names a file" through a symlink renamed
    over its file, so when a new file was renamed over the symlink (the symlink's object at
    the path, the new file not uploaded yet) the model called the symlink's object lost.
    The promise ends with the file at the path."""
    sim.save("f", sim.payload(100))
    sim.drain()
    sim.check_drained()
    sim.symlink("s", b"a")
    sim.rename("s", "f")
    sim.drain()
    sim.check_drained()
    sim.save("n", sim.payload(50))
    sim.rename("n", "f")
    sim.check()
    sim.drain()
    sim.check_drained()



def test_unuploaded_hard_linked_file_renamed_over_an_uploaded_file(sim):
    """Found by the long run of 2026-11-25 (seed 20261128), on the code of that morning too.
    `ln b a; mv b f` over an uploaded f, b written and never uploaded: b's upload goes to its
    first name (a), so adopt_replaced did not hand it f's old object, and the unlink job of
    the old f deleted that object before b reached S3 anywhere: S3 held neither version of
    f. A dirty file at the path now adopts the object; its upload drops it once its own
    object has landed (at a, its first name)."""
    sim.create("f")
    sim.drain()
    sim.check_drained()
    sim.create("b")
    sim.link("b", "a")
    sim.write("b", 0, sim.payload(1), stable=False)
    sim.rename("b", "f")
    sim.dispatch()                                  # the old f's unlink job runs first
    for p in [p for p in sim.pending if p.op == "DeleteObject"]:
        sim.grant(p)
        sim.check()
    sim.drain()
    sim.check_drained()


def _upload_first(sim, path: str) -> None:
    """Queue only `path`'s upload and run it to the end, before any other file's."""
    sim.enqueue(flush=True, prefix=path)
    sim.dispatch()
    ino = sim.node(path).ino
    (job_id,) = [jid for jid, j in sim.store.queue_list(1 << 30) if j.get("kind") == UPLOAD and j["ino"] == ino]
    assert sim.grant_job(job_id)
    sim.check()


def _a_new_file_there_uploaded_first(sim, path: str, moved_to: str, mkdir: str | None = None) -> None:
    """The jobs of the move or unlink run; a new file at `path` (in a new directory `mkdir`) is
    uploaded before the old file's upload; then everything drains and the old file, now at
    `moved_to`, must read back whole."""
    for _ in range(3):
        sim.dispatch()
        sim.grant_all()
    if mkdir:
        sim.mkdir(mkdir)
    sim.save(path, sim.payload(3000))
    _upload_first(sim, path)
    sim.drain()
    sim.check_drained()
    assert sim.read_through(moved_to) is not None


def _evicted_and_written(sim, path: str) -> None:
    sim.save(path, sim.payload(5000))
    sim.drain()
    sim.evict(path)
    sim.write(path, 0, sim.payload(10))      # the rest of its bytes only in its object now


def test_evicted_file_written_renamed_and_its_old_name_reused_keeps_its_bytes(sim):
    """Found in review (2026-11-29): a file evicted, written in part and renamed; its move left the
    (stale) object at the old name, the file's only copy of its unwritten bytes; a new file took
    the name and its upload replaced that object: the first file's upload could never fetch them.
    The move now fetches the absent ranges before it leaves the object."""
    _evicted_and_written(sim, "a")
    sim.rename("a", "b")
    _a_new_file_there_uploaded_first(sim, "a", "b")


def test_evicted_file_written_its_directory_renamed_and_the_old_name_reused_keeps_its_bytes(sim):
    """As above through a directory move (mv d e; mkdir d; a new d/f uploaded first)."""
    sim.mkdir("d")
    _evicted_and_written(sim, "d/f")
    sim.rename("d", "e")
    _a_new_file_there_uploaded_first(sim, "d/f", "e/f", mkdir="d")


def test_evicted_hard_linked_file_written_and_the_name_of_its_object_reused_keeps_its_bytes(sim):
    """As above through an unlink: the name holding a hard-linked file's object removed after a
    write, a new file at that name uploaded first."""
    _evicted_and_written(sim, "a")
    sim.link("a", "b")
    sim.remove("a")
    _a_new_file_there_uploaded_first(sim, "a", "b")


def test_directory_moved_under_a_directory_moved_onto_its_old_name_gets_one_marker(sim):
    """Found by the model test (2026-11-29, seed 20261130): `mv d imp/latest.pt; mv imp d` with d's
    mkdir still queued. Its marker went under the directory's current path, d/latest.pt/; the first
    rename's job, moving what was under the old d/, took it along (imp/latest.pt/latest.pt/) and the
    second left it at d/latest.pt/latest.pt/, a directory the namespace never had. A mkdir job whose
    directory's current path a rename queued after it would move again now puts its marker where the
    directory was when the job was queued; the renames carry it."""
    sim.mkdir("imp")
    sim.mkdir("d")
    sim.rename("d", "imp/latest.pt")
    sim.rename("imp", "d")
    sim.drain()
    sim.check_drained()
    assert {k for k in sim.fake.keys() if k.endswith("/")} == {"d/", "d/latest.pt/"}


def test_evicted_range_written_unstable_then_a_crash_reads_old_or_new_bytes(sim):
    """Found by the model test (2026-11-29, seed 20261130), a finding of the model, not of the
    store: an UNSTABLE overwrite of an evicted range, then kill -9. Nothing was promised for the
    write; its record was still pending, so the range is ABSENT again and reads the object's
    (durable) bytes, where the model expected the unstable ones. The model now takes either the
    written or the durable byte after a crash, never a third."""
    sim.save("a", sim.payload(1))
    sim.drain()
    sim.evict("a")
    sim.kill9()
    sim.write("a", 1217, sim.payload(1))
    sim.write("a", 0, sim.payload(1))
    sim.kill9()
    sim.check()
    assert sim.read_through("a") is not None
    sim.drain()
    sim.check_drained()


@pytest.mark.parametrize("kill", [False, True])
@pytest.mark.parametrize("size", [3000, 6000])
def test_upload_applied_with_its_reply_lost_is_not_sent_again(sim, size, kill):
    """Issue 38, exactly once (invariant 7): S3 applied a file's PutObject (3000 bytes) or
    CompleteMultipartUpload (6000: multipart) and the reply was lost; then the gate's retry, or
    after a kill -9 (the upload never recorded) the next start, must adopt that object instead of
    storing the same bytes and metadata again: one version at the key. Failed before the uploader
    HEADed first (a second version with the same bytes, as in the HA failover test)."""
    sim.save("latest.pt", sim.payload(size))
    sim.enqueue(flush=True)
    sim.dispatch()
    op = "PutObject" if size < sim.settings.multipart_threshold else "CompleteMultipartUpload"
    grant_until(sim, op)
    sim.set_faults(lost_reply=1.0)
    sim.grant(sim.pending[0])             # applied, the reply lost: the job retries
    sim.set_faults()
    sim.check()
    if kill:
        sim.kill9()
        sim.check()
    sim.drain()
    sim.check_drained()
    assert len([v for v in sim.fake.history["latest.pt"] if not v.deleted]) == 1


@pytest.mark.parametrize("written", [False, True])
@pytest.mark.parametrize("size", [3000, 6000])
def test_upload_applied_unrecorded_then_killed_and_renamed_leaves_no_object_at_the_old_name(sim, size, written):
    """The same crash window, then `mv a latest.pt` before the upload runs again: the object S3
    took at `a` is named by no record, and the rename's job found nothing to move, so it stayed
    in S3 for ever (after the drain the bucket held `a`; failed before this fix, on the worker
    before 553abfe too). The move now looks at the old name when the file's upload had begun
    (F_SENT): our object of the file's current bytes is copied to the new name, where the upload
    adopts it, and removed from the old one (written: the file was written again after the
    restart, so that object is stale: only removed, and the new bytes uploaded)."""
    sim.save("a", sim.payload(size))
    sim.enqueue(flush=True)
    sim.dispatch()
    grant_until(sim, "PutObject" if size < sim.settings.multipart_threshold else "CompleteMultipartUpload")
    sim.set_faults(lost_reply=1.0)
    sim.grant(sim.pending[0])
    sim.set_faults()
    sim.kill9()
    sim.check()
    if written:
        sim.write("a", 0, b"new", stable=True)
    sim.rename("a", "latest.pt")
    sim.drain()
    sim.check_drained()
    sent = "PutObject" if size < sim.settings.multipart_threshold else "CompleteMultipartUpload"
    assert [v.op for v in sim.fake.history["latest.pt"]] == [sent if written else "CopyObject"]


@pytest.mark.parametrize("written", [False, True])
@pytest.mark.parametrize("size", [3000, 6000])
def test_upload_applied_unrecorded_then_killed_and_its_directory_renamed(sim, size, written):
    """The crash window under `d`, then `mv d e` (written: the file written again first). The
    directory move copies every object of ours it lists; a stale unrecorded one put bytes at
    e/a that the file never held there (invariant 6), so it is now only removed; a current one
    is copied and the upload adopts the copy (invariant 7: not sent again)."""
    sim.mkdir("d")
    sim.save("d/a", sim.payload(size))
    sim.enqueue(flush=True)
    sim.dispatch()
    grant_until(sim, "PutObject" if size < sim.settings.multipart_threshold else "CompleteMultipartUpload",
                limit=50)
    sim.set_faults(lost_reply=1.0)
    sim.grant(sim.pending[0])
    sim.set_faults()
    sim.kill9()
    sim.check()
    if written:
        sim.write("d/a", 0, b"new", stable=True)
    sim.rename("d", "e")
    sim.drain()
    sim.check_drained()


@pytest.mark.parametrize("written", [False, True])
@pytest.mark.parametrize("size", [3000, 6000])
def test_new_bytes_uploaded_over_the_recorded_object_unrecorded_then_renamed(sim, size, written):
    """An uploaded file saved again; the upload of its new bytes replaced its recorded object
    at `a` in S3, and a kill -9 kept that from the record; then `mv a b` (written: after yet
    another write). The move saw a stale record and left the object for the upload, whose
    drop of the recorded ETag then missed it (412): `a` stayed in S3 for ever. The move now
    HEADs that name: an object of ours other than the recorded one is moved (current) or
    removed (stale)."""
    sim.save("a", sim.payload(size))
    sim.drain()
    sim.save("a", sim.payload(size))
    sim.enqueue(flush=True)
    sim.dispatch()
    grant_until(sim, "PutObject" if size < sim.settings.multipart_threshold else "CompleteMultipartUpload",
                limit=50)
    sim.set_faults(lost_reply=1.0)
    sim.grant(sim.pending[0])
    sim.set_faults()
    sim.kill9()
    sim.check()
    if written:
        sim.write("a", 0, b"new", stable=True)
    sim.rename("a", "b")
    sim.drain()
    sim.check_drained()


@pytest.mark.parametrize("size", [3000, 6000])
def test_upload_applied_unrecorded_then_killed_and_its_name_unlinked_while_a_link_stays(sim, size):
    """The crash window, then `ln a c; rm a`: the unlink's job saw a record with no object and
    answered "never uploaded", so the object S3 took at `a` stayed for ever (the bucket after the
    drain held `a`). Only a job saying `sent: False` (F_SENT unset) skips the look now."""
    sim.save("a", sim.payload(size))
    sim.enqueue(flush=True)
    sim.dispatch()
    grant_until(sim, "PutObject" if size < sim.settings.multipart_threshold else "CompleteMultipartUpload",
                limit=50)
    sim.set_faults(lost_reply=1.0)
    sim.grant(sim.pending[0])
    sim.set_faults()
    sim.kill9()
    sim.check()
    sim.link("a", "c")
    sim.remove("a")
    sim.drain()
    sim.check_drained()


def test_imported_file_truncated_written_unstable_then_removed_after_its_directory_moved(sim):
    """Found by the model run of 553abfe (fails the same on dd7d78a): an imported file
    truncated to 0 and drained, written 1 byte (unstable), its directory renamed and the file
    removed before the directory's move ran: the move copied the removed file's 0-byte
    object to a/x (invariant 6), which only the unlink's job removed later."""
    sim.import_external("imp/x", sim.payload(10))
    sim.truncate("imp/x", 0)
    sim.drain()
    sim.write("imp/x", 0, b"z")
    sim.rename("imp", "a")
    sim.remove("a/x")
    sim.drain()
    sim.check_drained()


def copy_applied_reply_lost(s: Sim, key: str, kill: bool) -> None:
    """Run the queued jobs until the CopyObject to `key` is next, let S3 apply it and lose its
    reply (the job retries), kill -9 first if `kill`, then drain: `key` holds one version, the
    copy's."""
    s.dispatch()
    grant_until(s, "CopyObject", limit=50, what=key)
    s.set_faults(lost_reply=1.0)
    s.grant(s.pending[0])                 # applied, the reply lost: the job retries
    s.set_faults()
    s.check()
    if kill:
        s.kill9()                         # between the copy and the re-key: the move replays
        s.check()
    s.drain()
    s.check_drained()
    assert [v.op for v in s.fake.history[key]] == ["CopyObject"]


@pytest.mark.parametrize("kill", [False, True])
@pytest.mark.parametrize("size", [3000, 6000])
def test_move_copied_with_its_reply_lost_is_not_copied_again(sim, size, kill):
    """Issue 38, exactly once for moves (invariant 7 on CopyObject): a checkpoint shard saved
    under a temporary name, uploaded, then renamed to its final name; S3 applied the move's
    CopyObject and the reply was lost. Then the gate's retry, or after a kill -9 between the
    copy and the re-key the next start's replay of the move, copied the same object to the
    final name again: a second version with the same bytes and metadata (tests/ha `repeated`).
    6000 bytes: the source is a multipart upload, whose ETag the copy does not keep."""
    sim.save("latest.pt.tmp", sim.payload(size))
    sim.drain()
    sim.rename("latest.pt.tmp", "latest.pt")
    copy_applied_reply_lost(sim, "latest.pt", kill)


@pytest.mark.parametrize("kill", [False, True])
@pytest.mark.parametrize("size", [3000, 6000])
def test_directory_move_copied_with_its_reply_lost_is_not_copied_again(sim, size, kill):
    """The same window in a directory move (`mv d e`, each object copy -> re-key -> delete):
    the replay HEADs each destination and skipped an object whose ETag the copy there kept
    (3000 bytes, killed: passed before), but a copy does not keep a multipart upload's ETag
    (6000 bytes), so the replay copied it again."""
    sim.mkdir("d")
    sim.save("d/a", sim.payload(size))
    sim.drain()
    sim.rename("d", "e")
    copy_applied_reply_lost(sim, "e/a", kill)


@pytest.mark.parametrize("kill", [False, True])
@pytest.mark.parametrize("size", [3000, 6000])
def test_object_moved_to_the_next_link_with_its_reply_lost_is_not_copied_again(sim, size, kill):
    """The same window in the move of an unlinked name's object to the file's next link (`ln a
    c; rm a`: copy to c, re-key, then a's object goes)."""
    sim.save("a", sim.payload(size))
    sim.drain()
    sim.link("a", "c")
    sim.remove("a")
    copy_applied_reply_lost(sim, "c", kill)


def test_imported_hard_linked_file_moved_with_its_directory_then_the_key_imported_again(sim):
    """Found by the model's random mode in session 28 (seed
    321787191165880900111250706630312913911, CKPTGW_MODEL_EXAMPLES=400; the code before and
    after 5fe53a7 alike): an imported empty file hard-linked, written through the link and
    uploaded, the link removed, its directory moved, and the same key imported again before
    the jobs ran. The unlink's move to the file's next link copied its object to that name as
    it was (imp/x), over the object the import had just brought in as a new file; the directory
    move then took it to a/x and the new file was left CLEAN with no object. Import now skips
    the new names of queued jobs too (Store.owned_keys), until a later import."""
    sim.import_external("imp/x", b"")
    sim.check()
    sim.link("imp/x", "a")
    sim.check()
    sim.write("a", 0, b"1")
    sim.check()
    sim.drain()
    sim.check()
    sim.remove("a")
    sim.check()
    sim.rename("imp", "a")
    sim.check()
    sim.import_external("imp/x", b"")
    sim.check()
    sim.drain()
    sim.check_drained()


def test_hard_linked_file_written_again_and_its_second_name_renamed_leaves_no_stale_object(sim):
    """Found by the model's long mode in session 28 (seed 20261205 on fd515ee; the code before
    3727c00 fails the same): a file uploaded as d/a, hard-linked as latest.pt.tmp (now its first
    name: the root's names sort first), written again (1 byte) and flushed: its new bytes were PUT
    at latest.pt.tmp; meanwhile latest.pt.tmp renamed to imp/a, which made d/a the first name
    again. The upload kept the file's old 0-byte object at d/a, taking it for one the rename's move
    would copy over, but that move copies to imp/a: after the drain d/a still held it. An upload now
    keeps an older object at the file's current name only if a queued job carries the new one
    there (Store.moves_to)."""
    sim.save("latest.pt", sim.payload(0))
    sim.create("a")
    sim.mkdir("d")
    sim.create("d/a")
    sim.drain()
    sim.check()
    sim.link("d/a", "latest.pt.tmp")
    sim.save("d/a", sim.payload(1))
    sim.enqueue(True)
    sim.dispatch()
    sim.check()
    sim.mkdir("imp")
    sim.rename("latest.pt.tmp", "imp/a")
    sim.check()
    sim.drain()
    sim.check_drained()
