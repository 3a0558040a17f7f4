"""Declarative XDR layer (RFC 4506), sans-I/O.

    from nfsd.xdr import XdrError, encode, decode
    from nfsd.xdr.nfs4 import *       # NFSv4.x types and constants (RFC 7863)
    from nfsd.xdr.rpc import *        # ONC RPC v2 message types (RFC 5531)

Types are described once, in the .x files next to this package, and compiled at
import by xparser + core; no type has a hand-written packer.
"""
from .core import XdrError, decode, encode

__all__ = ["XdrError", "encode", "decode"]
