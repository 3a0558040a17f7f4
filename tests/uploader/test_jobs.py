"""The per-path ordering rule of the durable jobs (pure)."""
from uploader.jobs import KeyRef, KeysAhead, ns_keys


def test_keyref_overlap():
    assert KeyRef("a/b").overlaps(KeyRef("a/b"))
    assert not KeyRef("a/b").overlaps(KeyRef("a/bc"))
    assert KeyRef("a/", True).overlaps(KeyRef("a/b"))
    assert not KeyRef("a/", True).overlaps(KeyRef("ab"))
    assert KeyRef("a/", True).overlaps(KeyRef("a/b/", True))
    assert not KeyRef("a/", True).overlaps(KeyRef("b/", True))


def test_ns_keys_of_each_op():
    assert ns_keys({"op": "rename", "type": "reg", "old_path": "x.tmp", "new_path": "x"}) == [
        KeyRef("x.tmp"), KeyRef("x")]
    assert ns_keys({"op": "rename", "type": "dir", "old_path": "d1", "new_path": "d2"}) == [
        KeyRef("d1/", True), KeyRef("d2/", True)]
    assert ns_keys({"op": "unlink", "old_path": "f"}) == [KeyRef("f")]
    # a hard-linked file's unlink moves its object to its next name: uploads there wait
    assert ns_keys({"op": "unlink", "old_path": "f", "new_path": "g"}) == [KeyRef("f"), KeyRef("g")]
    assert ns_keys({"op": "mkdir", "new_path": "d"}) == [KeyRef("d/")]
    assert ns_keys({"op": "rmdir", "old_path": "d"}) == [KeyRef("d/")]
    assert ns_keys({"op": "link", "old_path": "a", "new_path": "b"}) == []


def test_keys_ahead_blocks_overlapping_later_jobs_only():
    ahead = KeysAhead()
    ahead.add(ns_keys({"op": "rename", "type": "dir", "old_path": "d1", "new_path": "d2"}))
    assert ahead.blocks([KeyRef("d2/x")])                 # inside the moved directory
    assert ahead.blocks([KeyRef("d1/sub/", True)])
    assert ahead.blocks([KeyRef("d2/")])                  # the marker itself
    assert not ahead.blocks([KeyRef("d3/x")])
    ahead.add([KeyRef("f")])
    assert ahead.blocks([KeyRef("f")]) and not ahead.blocks([KeyRef("f2")])
    assert ahead.blocks([KeyRef("", True)])               # a move of the root prefix covers all
