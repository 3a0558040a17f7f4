"""The NFSv4 op dispatch table: every op module's HANDLERS merged into one dict.

One module per op family (the NFS-Ganesha shape: find an op by its family name);
each exports `HANDLERS = {OP_X: async handler(ctx, args) -> X4res}`.
"""
from __future__ import annotations

import importlib

import structlog

log = structlog.get_logger(__name__)

OP_MODULES = (
    "nfsd.ops.session",      # EXCHANGE_ID CREATE_SESSION DESTROY_* BIND_CONN_TO_SESSION RECLAIM_COMPLETE
    "nfsd.ops.filehandle",   # PUTFH PUTROOTFH PUTPUBFH GETFH SAVEFH RESTOREFH LOOKUP LOOKUPP
    "nfsd.ops.attrs",        # GETATTR SETATTR ACCESS VERIFY NVERIFY
    "nfsd.ops.namespace",    # CREATE LINK REMOVE RENAME READLINK
    "nfsd.ops.readdir",      # READDIR
    "nfsd.ops.open",         # OPEN OPEN_DOWNGRADE CLOSE DELEGRETURN
    "nfsd.ops.io",           # READ WRITE COMMIT
    "nfsd.ops.secinfo",      # SECINFO SECINFO_NO_NAME
    "nfsd.ops.stateid",      # TEST_STATEID FREE_STATEID
    "nfsd.ops.lock",         # LOCK LOCKT LOCKU
    "nfsd.ops.v40",          # SETCLIENTID SETCLIENTID_CONFIRM RENEW RELEASE_LOCKOWNER (4.0 only)
    "nfsd.ops.v42",          # SEEK ALLOCATE DEALLOCATE READ_PLUS COPY CLONE OFFLOAD_* (4.2 only)
    "nfsd.ops.xattr",        # GETXATTR LISTXATTRS SETXATTR REMOVEXATTR (RFC 8276, 4.2 only)
)


def load_handlers(modules=OP_MODULES) -> dict:
    """Import the op modules and merge their tables. A module that is missing (only
    while the project is being built) is skipped with a warning; a module that
    fails to import for any other reason is an error."""
    handlers: dict = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            log.warning("op_module_missing", module=name)
            continue
        for opnum, handler in module.HANDLERS.items():
            # The same function may arrive twice (a module re-exporting another's table);
            # two different handlers for one op are a bug.
            if handlers.get(opnum, handler) is not handler:
                raise RuntimeError(f"op {opnum} handled twice (second time in {name})")
            handlers[opnum] = handler
    return handlers


HANDLERS = load_handlers()


def native_forms(handlers: dict) -> dict:
    """The typed twins (nfsd/native/fileops.pyx) of those of `handlers` that are the stock
    handlers, for the op table's `native` column: only the native COMPOUND loop calls them, so
    none when it does not run (CKPTGW_ENGINE=python, or not built)."""
    from nfsd import compound, native
    if compound.COMPOUND_ENGINE != "native" or native.engine("fileops") != "native":
        return {}
    from nfsd.native.fileops import TWINS
    return {num: twin for num, (ref, twin) in TWINS.items() if handlers.get(num) is ref}
