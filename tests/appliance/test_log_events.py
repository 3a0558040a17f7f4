"""Log event names, read from the source: one style (snake_case `<room>_<what>`), and one name
per event (no event logged by two layers under one name or two)."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("appliance", "uploader", "nfsd", "cache")
# log.info("name", ...), self.log.warning("name"), ratelog.warning("name", ...): a literal name
# (a name built at run time, "backchannel_" + state, is not matched)
CALL = re.compile(r"""\b\w*log\w*\.(?:debug|info|warning|error|exception|critical)\(\s*"([^"]*)"\s*[,)]""")
SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
# one name, one event, reported from two rooms: eviction by `ckptgw evict` and by the watermarks
SHARED = {"evicted"}


def events() -> dict[str, set[str]]:
    """event name -> the files logging it."""
    out: dict[str, set[str]] = defaultdict(set)
    for room in ROOMS:
        for path in (REPO / room).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith("nfsd/native/"):
                continue
            for name in CALL.findall(path.read_text()):
                out[name].add(rel)
    return out


def test_event_names_are_snake_case():
    found = events()
    assert len(found) > 100, sorted(found)          # the pattern still finds the calls
    odd = sorted(n for n in found if not SNAKE.fullmatch(n))
    assert not odd, {n: sorted(found[n]) for n in odd}


def test_no_event_is_logged_by_two_rooms():
    """The daemon logged uploader_started beside the uploader's own, and nfs_listening beside
    the server's nfsd_listening: one layer logs each event (the one that did it)."""
    found = events()
    twice = {n: sorted(files) for n, files in found.items()
             if len({f.split("/")[0] for f in files}) > 1 and n not in SHARED}
    assert not twice, twice
    assert "nfs_listening" not in found and found["nfsd_listening"] == {"nfsd/server.py"}
    assert found["uploader_started"] == {"uploader/service.py"}
