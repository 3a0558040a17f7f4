"""The store ("cache" room): namespace + data + durability on local disk, no XDR, no S3.

Callers use `cache.store.Store` (the API) and the types in `cache.api`; everything else
here is the store's inside: `Store`'s jobs as mixins of the one object (writepath.py,
fences.py, sparsecopy.py, eviction.py, remote.py, uploadqueue.py, storebase.py; store.py
says which does what), index.py (LMDB layout), extents.py (per-file extent maps),
data.py (extent files), namespace.py (namespace ops), commit.py (group commit),
recovery.py (crash recovery at open), check.py (consistency checker), space.py
(capacity, watermarks, admission).
"""
