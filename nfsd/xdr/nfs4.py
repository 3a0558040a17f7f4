"""NFSv4.0/4.1/4.2 protocol types and constants (RFC 7863), built from nfs4_prot.x at import.

Every type and constant of the RFC 7863 XDR is a module attribute under its exact RFC
name (COMPOUND4args, nfs_argop4, stateid4, fattr4, NFS4_OK, OP_READ, FATTR4_SIZE, ...),
plus the program constants rpcgen would define (NFS4_PROGRAM=100003, NFS_V4=4,
NFSPROC4_NULL=0, NFSPROC4_COMPOUND=1, NFS4_CALLBACK, NFS_CB, CB_NULL, CB_COMPOUND) and
the int typedefs (int32_t, uint32_t, int64_t, uint64_t).  See nfsd/xdr/core.py for the
Python representation of each XDR kind.

Zero copy: WRITE4args.data decodes to a memoryview slice of the input buffer (not
bytes), so a 1 MiB WRITE is not copied by decoding.  The slice keeps the receive
buffer alive; copy it (bytes(...)) if it must outlive the request.

The spec refers to RFC 5531 names (authsys_parms, AUTH_NONE, AUTH_SYS, RPCSEC_GSS);
they are taken from nfsd.xdr.rpc and also re-exported here for convenience.
"""
from __future__ import annotations

from . import rpc as _rpc
from ._loader import load_package_spec

# Fields that decode to memoryview slices of the input instead of bytes (see above).
ZERO_COPY_FIELDS = frozenset({("WRITE4args", "data")})

# Counts the protocol leaves open but a client must not make us allocate in proportion
# to (see nfsd/xdr/xparser.py "Decode limits"). bitmap4: RFC 8881/7862/8276 define
# attributes up to number 82 (3 words), but RFC 7530 5 / RFC 8881 5 want a request for
# an attribute the server does not know ignored (GETATTR) or answered ATTRNOTSUPP, not
# refused as garbage: pynfs asks for attribute 1000 (32 words). 64 words (2,048
# attribute numbers, at most 64 ints once decoded) let such requests through; a longer
# bitmap is still refused at decode (GARBAGE_ARGS) instead of being expanded, and past
# decoding a bitmap is masked word by word against what we support (nfsd/attrs.py).
MAX_BITMAP_WORDS = 64
# Unbounded arrays of objects in what a client sends ("Owner.field": such a member has
# no typedef name). Decoded, each entry is a Python object several times its wire size
# (a 2 MiB CREATE_SESSION of 524,288 AUTH_NONE sec parms kept ~29 MiB, 14x; a
# TEST_STATEID of 131,072 stateids ~8x), and up to max_inflight records per connection
# decode at once: so each count is capped, far above what real clients send, and a
# longer array is refused at decode (GARBAGE_ARGS) before anything is allocated.
# Callback security parameters: Linux sends 1-2, pynfs at most 3 (st_create_session).
MAX_CB_SEC_PARMS = 16
# TEST_STATEID: Linux sends 1 stateid, pynfs 1; 1,024 is 16 KiB of stateids.
MAX_TEST_STATEIDS = 1024
# SSV state protection (EXCHANGE_ID): pynfs sends 2 hash and 2 encryption OIDs.
MAX_SSV_ALGS = 16
# COPY's source servers (inter-server copy): clients send one, RFC 7862 names a list.
MAX_COPY_SOURCES = 16
# LAYOUTERROR: one device_error4 per device the client had trouble with.
MAX_LAYOUT_ERRORS = 256
# CB_COMPOUND replies: a client answers our CB_COMPOUND (CB_SEQUENCE and at most one more
# op, nfsd/callback.py) with one result per op; more than 16 is not an answer to it.
MAX_CB_RESULTS = 16
# Left open on purpose: result-only arrays of the fore channel (we encode them, a client
# never sends them) and the CB_* argument arrays we send; COMPOUND4args.argarray is decoded op by op by
# nfsd/compound.py, which refuses more than MAX_DECODED_OPS before decoding them.
DECODE_LIMITS = {
    "bitmap4": MAX_BITMAP_WORDS,
    "CREATE_SESSION4args.csa_sec_parms": MAX_CB_SEC_PARMS,
    "BACKCHANNEL_CTL4args.bca_sec_parms": MAX_CB_SEC_PARMS,
    "TEST_STATEID4args.ts_stateids": MAX_TEST_STATEIDS,
    "ssv_sp_parms4.ssp_hash_algs": MAX_SSV_ALGS,
    "ssv_sp_parms4.ssp_encr_algs": MAX_SSV_ALGS,
    "COPY4args.ca_source_server": MAX_COPY_SOURCES,
    "LAYOUTERROR4args.lea_errors": MAX_LAYOUT_ERRORS,
    "CB_COMPOUND4res.resarray": MAX_CB_RESULTS,
}

_imports = {name: getattr(_rpc, name) for name in ("authsys_parms", "AUTH_NONE", "AUTH_SYS",
                                                    "RPCSEC_GSS")}
_ns = load_package_spec("nfs4_prot.x", imports=_imports, zero_copy=ZERO_COPY_FIELDS,
                         limits=DECODE_LIMITS)
_ns.update(_imports)
globals().update(_ns)
__all__ = sorted(_ns)
