"""Checkpoint series: which directories of the namespace are the checkpoints of a series.

A series names its checkpoints with a pattern over export-relative paths, one component
per "/":  "runs/*/step_{step}".  In a component, `{step}` captures decimal digits (the
checkpoint's step number), `*` matches any run of characters within that component (so a
lone `*` matches exactly one path component) and everything else matches literally. A
component must match a whole name: `step_000900.tmp` is not `step_{step}`. A trailing
"/**" is allowed and changes nothing (a checkpoint always includes its subtree). Every
DIRECTORY whose path matches is one checkpoint; names ending in `.tmp` (an unfinished
save) never are. Checkpoints are ordered by step, or by their newest mtime when the
pattern captures no step.

`discover()` walks only the directories the pattern can reach (literal components are
single lookups) and summarises each checkpoint: files, bytes, newest mtime, whether any
file is dirty (not yet in S3) or open, pins, and stale temporary entries. It blocks (LMDB
reads): asyncio callers run it in a thread.
"""
from __future__ import annotations

import errno
import re
from dataclasses import dataclass, field

from cache.api import ROOT_INO, DataState, FileType, StoreError

STEP = "{step}"
_CLEAN_STATES = (DataState.CLEAN, DataState.ABSENT)


class PatternError(ValueError):
    """A series pattern that cannot be used; the message says what was expected."""


@dataclass(frozen=True)
class Pattern:
    text: str
    components: tuple[str, ...]          # as written
    regexes: tuple[re.Pattern | None, ...]  # None: a literal component (one lookup)
    step_component: int | None           # index of the component holding {step}

    @property
    def literal_prefix(self) -> str:
        """The leading literal components joined with "/" ("runs/" for "runs/*/step_{step}")."""
        out = []
        for comp, rx in zip(self.components, self.regexes):
            if rx is not None:
                break
            out.append(comp)
        return "".join(c + "/" for c in out)

    def match_component(self, index: int, name: str) -> tuple[bool, int | None]:
        """(matches, captured step) for one name at component `index`."""
        rx = self.regexes[index]
        if rx is None:
            return name == self.components[index], None
        m = rx.fullmatch(name)
        if m is None:
            return False, None
        step = m.groupdict().get("step")
        return True, (int(step) if step is not None else None)


def parse_pattern(text: str) -> Pattern:
    """Compile a series pattern; PatternError("expected ...") when it is not usable."""
    if not isinstance(text, str) or not text.strip("/"):
        raise PatternError(f'expected a path pattern such as "runs/*/step_{{step}}", got {text!r}')
    comps = text.strip("/").split("/")
    if len(comps) > 1 and comps[-1] == "**":
        comps.pop()                  # "dir/**": the directory with everything in it, as without
    regexes: list[re.Pattern | None] = []
    step_at = None
    for i, comp in enumerate(comps):
        if comp in ("", ".", ".."):
            raise PatternError(f"expected path components without empty, '.' or '..' parts, got {text!r}")
        if "**" in comp:
            raise PatternError(f"expected '*' to match one path component ('**' is not supported), got {text!r}")
        rest = comp.replace(STEP, "")
        if "{" in rest or "}" in rest:
            raise PatternError(f"expected only {{step}} as a placeholder, got {comp!r} in {text!r}")
        if comp.count(STEP) > 1 or (STEP in comp and step_at is not None):
            raise PatternError(f"expected {{step}} at most once, got {text!r}")
        if STEP in comp:
            step_at = i
        if "*" not in comp and STEP not in comp:
            regexes.append(None)
            continue
        rx = ""
        for piece in re.split(r"(\{step\}|\*)", comp):
            if piece == STEP:
                rx += r"(?P<step>\d+)"
            elif piece == "*":
                rx += r"[^/]*"
            else:
                rx += re.escape(piece)
        regexes.append(re.compile(rx))
    return Pattern(text, tuple(comps), tuple(regexes), step_at)


def is_tmp_name(name: str) -> bool:
    """Temporary names of an unfinished save: "*.tmp" and ".tmp*"."""
    return name.endswith(".tmp") or name.startswith(".tmp")


def has_tmp_component(path: str) -> bool:
    """Whether any component of an export-relative path is a temporary name."""
    return any(is_tmp_name(p) for p in path.split("/") if p)


# ---- discovery ---------------------------------------------------------------------------
@dataclass
class TmpEntry:
    path: str
    ino: int
    is_dir: bool
    newest_mtime_ns: int
    busy: bool                      # something in it is open


@dataclass
class Checkpoint:
    series: str
    path: str                       # export-relative
    ino: int
    step: int | None
    files: int = 0
    bytes: int = 0
    newest_mtime_ns: int = 0
    dirty_files: int = 0            # not (yet) clean in S3
    open_files: int = 0
    file_inos: list = field(default_factory=list)   # [(path, ino)]
    pins: dict = field(default_factory=dict)        # path -> reason (the checkpoint, inside, or above)
    tmp: list = field(default_factory=list)         # TmpEntry inside the checkpoint

    @property
    def pinned(self) -> bool:
        return bool(self.pins)

    @property
    def busy(self) -> bool:
        """Still being written: a file dirty or open."""
        return self.dirty_files > 0 or self.open_files > 0

    @property
    def complete(self) -> bool:
        """Every file clean in S3, none open, no temporary entry left, at least one file."""
        return self.files > 0 and not self.busy and not self.tmp

    def incomplete_reason(self) -> str:
        if self.open_files:
            return f"{self.open_files} file(s) open"
        if self.dirty_files:
            return f"{self.dirty_files} file(s) not yet in S3"
        if self.tmp:
            return f"{len(self.tmp)} temporary entr{'y' if len(self.tmp) == 1 else 'ies'} inside"
        if not self.files:
            return "no files"
        return ""

    def order_key(self) -> tuple:
        return (self.step if self.step is not None else -1, self.newest_mtime_ns, self.path)

    def age_seconds(self, now: float) -> float:
        return max(0.0, now - self.newest_mtime_ns / 1e9)


@dataclass
class SeriesScan:
    name: str
    pattern: Pattern
    checkpoints: list[Checkpoint]        # oldest first (order_key)
    stale_candidates: list[TmpEntry]     # tmp entries beside the checkpoints (their parents)


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name


def _subtree(store, path: str, attr, sink) -> None:
    """Feed every entry under directory `attr` (not itself) to sink(path, attr)."""
    for p, a in store.walk(attr.ino, path):
        sink(p, a)


def _tmp_entry(store, path: str, attr, pinned) -> TmpEntry:
    newest, busy = attr.mtime_ns, store.is_open(attr.ino)
    pinned_inside = attr.ino in pinned
    if attr.type == FileType.DIR:
        box = {"newest": newest, "busy": busy, "pinned": pinned_inside}

        def sink(p, a):
            box["newest"] = max(box["newest"], a.mtime_ns)
            box["busy"] = box["busy"] or store.is_open(a.ino)
            box["pinned"] = box["pinned"] or a.ino in pinned
        _subtree(store, path, attr, sink)
        newest, busy, pinned_inside = box["newest"], box["busy"], box["pinned"]
    return TmpEntry(path, attr.ino, attr.type == FileType.DIR, newest, busy or pinned_inside)


def summarise(store, series: str, path: str, attr, step: int | None, pinned: dict[int, str],
              above_pins: dict[str, str]) -> Checkpoint:
    cp = Checkpoint(series, path, attr.ino, step, newest_mtime_ns=attr.mtime_ns, pins=dict(above_pins))
    if attr.ino in pinned:
        cp.pins[path] = pinned[attr.ino]
    if store.is_open(attr.ino):
        cp.open_files += 1
    tmp_roots: list[str] = []

    def sink(p, a):
        if any(p.startswith(t + "/") for t in tmp_roots):
            return                                   # counted with its tmp directory
        cp.newest_mtime_ns = max(cp.newest_mtime_ns, a.mtime_ns)
        if a.ino in pinned:
            cp.pins[p] = pinned[a.ino]
        name = p.rsplit("/", 1)[-1]
        if is_tmp_name(name):
            cp.tmp.append(_tmp_entry(store, p, a, pinned))
            if a.type == FileType.DIR:
                tmp_roots.append(p)
            return
        if a.type != FileType.REG:
            return
        cp.files += 1
        cp.bytes += a.size
        cp.file_inos.append((p, a.ino))
        if a.data_state not in _CLEAN_STATES:
            cp.dirty_files += 1
        if store.is_open(a.ino):
            cp.open_files += 1
    _subtree(store, path, attr, sink)
    return cp


def discover(store, name: str, pattern: Pattern) -> SeriesScan:
    """Every checkpoint of the series (oldest first) and the tmp entries beside them."""
    pinned = store.pinned()
    root = store.getattr(ROOT_INO)
    # frontier: (path, attr, step so far, pins on the way down)
    frontier = [("", root, None, {"": pinned[ROOT_INO]} if ROOT_INO in pinned else {})]
    last = len(pattern.components) - 1
    checkpoints: list[Checkpoint] = []
    stale: list[TmpEntry] = []
    for i in range(len(pattern.components)):
        nxt = []
        for base, attr, step, pins in frontier:
            if pattern.regexes[i] is None:                       # literal: one lookup
                try:
                    child = store.lookup(attr.ino, pattern.components[i].encode("utf-8", "surrogateescape"))
                except StoreError as e:
                    if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ESTALE):
                        continue
                    raise
                candidates = [(pattern.components[i], child)]
            else:
                try:
                    candidates = [(e.name.decode("utf-8", "surrogateescape"), e.attr)
                                  for e in store.readdir(attr.ino)]
                except StoreError as e:
                    if e.errno in (errno.ESTALE, errno.ENOENT, errno.ENOTDIR):
                        continue
                    raise
            for cname, cattr in candidates:
                path = _join(base, cname)
                if i == last and is_tmp_name(cname):
                    stale.append(_tmp_entry(store, path, cattr, pinned))
                    continue
                if cattr.type != FileType.DIR:
                    continue
                ok, captured = pattern.match_component(i, cname)
                if not ok:
                    continue
                cpins = dict(pins)
                if cattr.ino in pinned and i < last:
                    cpins[path] = pinned[cattr.ino]
                nxt.append((path, cattr, captured if captured is not None else step, cpins))
        frontier = nxt
    for path, attr, step, pins in frontier:
        checkpoints.append(summarise(store, name, path, attr, step, pinned, pins))
    checkpoints.sort(key=Checkpoint.order_key)
    return SeriesScan(name, pattern, checkpoints, stale)
