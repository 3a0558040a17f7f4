"""Exports, the pseudo-filesystem above them, client networks, squashing, AUTH_SYS
permission checks and owner-string mapping.

The pseudo-filesystem (RFC 8881 section 7.3) is a read-only tree of directories
whose leaves are export roots: with an export at "/checkpoints", PUTROOTFH gives
the pseudo root, and LOOKUP "checkpoints" crosses into the export (a new fsid),
so both `mount gateway:/` and `mount gateway:/checkpoints` work. An export at "/"
replaces the pseudo root.
"""
from __future__ import annotations

import grp
import ipaddress
import pwd
import stat
from dataclasses import dataclass, field

import structlog

from cache.api import ROOT_INO, FileType

log = structlog.get_logger(__name__)

AUTH_NONE = 0
AUTH_SYS = 1

# Pseudo fileids live far above any store inode number.
PSEUDO_FILEID_BASE = 1 << 62

# Permission wants, as in the mode bits of "other".
MAY_READ = 4
MAY_WRITE = 2
MAY_EXEC = 1


@dataclass(slots=True)
class Export:
    """One exported store subtree. `export_id` goes into file handles and the fsid,
    so it must stay the same across restarts (1..65535)."""
    export_id: int
    path: str                                   # absolute, e.g. "/checkpoints"
    networks: tuple = ("127.0.0.0/8", "::1/128")  # CIDRs allowed to use it
    rw: bool = True
    root_squash: bool = True
    all_squash: bool = False
    anonuid: int = 65534
    anongid: int = 65534
    # knfsd's `secure`: AUTH_SYS/AUTH_NONE calls must come from a source port < 1024
    # (only root binds those, so a client's uid claims rest on its root). `insecure`
    # (False) admits unprivileged ports: nfs-rs (noresvport), user-space tools, tests.
    secure: bool = True
    root_ino: int = ROOT_INO                    # store subtree (single export: the store root)
    _nets: list = field(default_factory=list, init=False, repr=False)
    # client address -> allowed: every op asks, parsing the address each time cost ~5% CPU
    _verdicts: dict = field(default_factory=dict, init=False, repr=False)
    # fileid of the pseudo directory it is mounted on (0: none); set by Exports
    mount_fileid: int = field(default=0, init=False)

    def __post_init__(self):
        if not 1 <= self.export_id <= 0xFFFF:
            raise ValueError(f"export id {self.export_id} not in 1..65535")
        if not self.path.startswith("/"):
            raise ValueError(f"export path {self.path!r} must be absolute")
        self.path = "/" + "/".join(p for p in self.path.split("/") if p)
        self._nets = [ipaddress.ip_network(n, strict=False) for n in self.networks]

    def allows(self, ip: str) -> bool:
        verdict = self._verdicts.get(ip)
        if verdict is None:
            if len(self._verdicts) >= 4096:      # bounded: a scan from many addresses
                self._verdicts.clear()
            verdict = self._verdicts[ip] = self._allows(ip)
        return verdict

    def port_ok(self, port: int) -> bool:
        return not self.secure or port < 1024

    def _allows(self, ip: str) -> bool:
        try:
            addr = ipaddress.ip_address(ip.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr.version == n.version and addr in n for n in self._nets)


@dataclass(slots=True)
class PseudoNode:
    index: int
    path: str
    parent: int
    children: dict = field(default_factory=dict)   # name bytes -> ("pseudo", index) | ("export", Export)

    @property
    def fileid(self) -> int:
        return PSEUDO_FILEID_BASE + self.index


@dataclass(slots=True, frozen=True)
class EffectiveCred:
    uid: int
    gid: int
    gids: frozenset

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.gids


class IdMapper:
    """Owner strings (RFC 8881 section 5.9): numeric ids, as Linux sends with id mapping
    off, or `name@domain` when a domain is configured (names from the host's passwd/group)."""

    def __init__(self, domain: str | None = None, reply_names: bool = False):
        self.domain = domain.lower() if domain else None
        self.reply_names = bool(domain) and reply_names

    def owner(self, uid: int) -> bytes:
        if self.reply_names:
            try:
                return f"{pwd.getpwuid(uid).pw_name}@{self.domain}".encode()
            except KeyError:
                pass
        return str(uid).encode()

    def group(self, gid: int) -> bytes:
        if self.reply_names:
            try:
                return f"{grp.getgrgid(gid).gr_name}@{self.domain}".encode()
            except KeyError:
                pass
        return str(gid).encode()

    def uid_of(self, owner: bytes) -> int | None:
        """None when the string names no known user (caller: NFS4ERR_BADOWNER)."""
        name = self._local_name(owner)
        if name is None:
            return None
        if name.isdigit():
            return _small_id(name)
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            return None

    def gid_of(self, group: bytes) -> int | None:
        name = self._local_name(group)
        if name is None:
            return None
        if name.isdigit():
            return _small_id(name)
        try:
            return grp.getgrnam(name).gr_gid
        except KeyError:
            return None

    def _local_name(self, s: bytes) -> str | None:
        try:
            text = bytes(s).decode("utf-8")
        except UnicodeDecodeError:
            return None
        if not text:
            return None
        if "@" in text:
            name, _, domain = text.rpartition("@")
            if not name or self.domain is None or domain.lower() != self.domain:
                return None
            return name
        return text


def _small_id(digits: str) -> int | None:
    value = int(digits)
    return value if value < 2**32 - 1 else None


class Exports:
    """All exports of this server plus the pseudo-filesystem that joins them."""

    def __init__(self, exports: list[Export], *, idmap: IdMapper | None = None):
        if not exports:
            raise ValueError("at least one export is required")
        ids = [e.export_id for e in exports]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate export ids {ids}")
        paths = [e.path for e in exports]
        if len(set(paths)) != len(paths):
            raise ValueError(f"duplicate export paths {paths}")
        self.exports = {e.export_id: e for e in exports}
        self.idmap = idmap or IdMapper()
        self.nodes: list[PseudoNode] = []
        self.root_export: Export | None = None
        self._build_pseudo(exports)

    @classmethod
    def single(cls, path: str = "/checkpoints", **kw) -> "Exports":
        """One export of the whole store (what `python -m nfsd --export PATH` serves)."""
        idmap = kw.pop("idmap", None)
        return cls([Export(1, path, **kw)], idmap=idmap)

    def _build_pseudo(self, exports: list[Export]) -> None:
        self.nodes.append(PseudoNode(0, "/", 0))
        for exp in sorted(exports, key=lambda e: e.path):
            if exp.path == "/":
                if len(exports) != 1:
                    raise ValueError("an export at / must be the only export")
                self.root_export = exp
                exp.mount_fileid = 0          # mounted on nothing: its own fileid
                continue
            parts = exp.path.strip("/").split("/")
            node = self.nodes[0]
            for part in parts[:-1]:
                child = node.children.get(part.encode())
                if child is None:
                    new = PseudoNode(len(self.nodes), f"{node.path.rstrip('/')}/{part}", node.index)
                    self.nodes.append(new)
                    node.children[part.encode()] = ("pseudo", new.index)
                    node = new
                elif child[0] == "pseudo":
                    node = self.nodes[child[1]]
                else:
                    raise ValueError(f"export {exp.path} is nested inside export {child[1].path}")
            leaf = parts[-1].encode()
            if leaf in node.children:
                raise ValueError(f"export {exp.path} overlaps another export")
            node.children[leaf] = ("export", exp)
            # A fileid for the (virtual) directory the export is mounted on.
            exp.mount_fileid = PSEUDO_FILEID_BASE + (1 << 32) + exp.export_id

    # ---- lookups ----------------------------------------------------------------
    def get(self, export_id: int) -> Export | None:
        return self.exports.get(export_id)

    def client_allowed(self, ip: str) -> bool:
        """Whether any export admits this client (RPC layer: others get AUTH_ERROR)."""
        return any(e.allows(ip) for e in self.exports.values())

    def port_allowed(self, ip: str, port: int) -> bool:
        """Whether a client at ip:port may call at all: a privileged port, or an
        `insecure` export admits it (others: AUTH_TOOWEAK, as knfsd answers)."""
        return port < 1024 or any(e.allows(ip) and not e.secure for e in self.exports.values())

    def node(self, index: int) -> PseudoNode | None:
        if 0 <= index < len(self.nodes):
            return self.nodes[index]
        return None

    def export_parent_node(self, exp: Export) -> PseudoNode:
        """The pseudo directory containing this export's root (LOOKUPP across the mount)."""
        for node in self.nodes:
            for kind, target in node.children.values():
                if kind == "export" and target is exp:
                    return node
        return self.nodes[0]

    # ---- credentials --------------------------------------------------------------
    def effective_cred(self, exp: Export | None, cred) -> EffectiveCred:
        """The RPC caller's ids after the export's squash rules (AUTH_NONE: anonymous)."""
        anonuid = exp.anonuid if exp else 65534
        anongid = exp.anongid if exp else 65534
        if cred.flavor != AUTH_SYS or (exp is not None and exp.all_squash):
            return EffectiveCred(anonuid, anongid, frozenset())
        uid, gid, gids = cred.uid, cred.gid, frozenset(cred.gids)
        if exp is not None and exp.root_squash:
            if uid == 0:
                uid = anonuid
            if gid == 0:
                gid = anongid
            if 0 in gids:
                gids = (gids - {0}) | {anongid}
        return EffectiveCred(uid, gid, gids)


# ---- AUTH_SYS permission checks (POSIX mode bits, as Linux does) ----------------------
def permitted(attr, who: EffectiveCred, want: int) -> bool:
    """Whether `who` has every bit of `want` (MAY_READ|MAY_WRITE|MAY_EXEC) on `attr`.
    Root passes read/write always and exec when the object is a directory or
    has any exec bit (Linux's CAP_DAC_OVERRIDE rule)."""
    mode = attr.mode
    if who.uid == 0:
        if want & MAY_EXEC and attr.type != FileType.DIR and not mode & 0o111:
            return False
        return True
    if who.uid == attr.uid:
        bits = (mode >> 6) & 7
    elif who.in_group(attr.gid):
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want == want


def sticky_allows_delete(dir_attr, victim_attr, who: EffectiveCred) -> bool:
    """In a sticky directory only the owner of the entry or of the directory (or root)
    may remove or rename it."""
    if not dir_attr.mode & stat.S_ISVTX or who.uid == 0:
        return True
    return who.uid in (dir_attr.uid, victim_attr.uid)
