"""ckptgw uploader: write-back from the store to S3, read-through, import.

Public face (the appliance wires these; nfsd never imports this package):

    from uploader.settings import S3Settings, UploadSettings
    from uploader.objectclient import Boto3ObjectClient
    from uploader.service import Uploader

    s3 = S3Settings(bucket=..., endpoint_url=..., region=..., prefix="ckpt/", addressing_style="path")
    up = Uploader(store, Boto3ObjectClient(s3, max_pool_connections=settings.max_concurrency + 4),
                  UploadSettings(settle_seconds=2.0, ...))      # prefix taken from the client
    await up.start()                    # never waits for S3; sweeps orphan uploads in the background
    nfs_server.fetch_missing = up.fetch_missing     # async (ino, [(off, len)]): read-through
    await up.flush("run1/step_100")     # skip the settle window, wait until clean -> bool
    up.status(); up.file_state(ino)     # plain dicts: counters for Prometheus, per-file state
    await up.warmup("run1"); await up.import_bucket()
    await up.stop()                     # unfinished work stays in the store's durable queue

Modules, one job each:
  settings.py     S3Settings / UploadSettings (validated dataclasses)
  objectclient.py ObjectClient protocol, Boto3ObjectClient, error classes, checksums
  ratelimit.py    token buckets, AIMD concurrency limit, backoff with full jitter
  gate.py         RequestGate: every S3 request through rate limits, slots, retries
  keys.py         key mapping, s3fs metadata, multipart part plan
  jobs.py         durable job kinds and the per-path ordering rule
  worker.py       what each job does in S3 (upload, move, delete, markers)
  service.py      Uploader: scheduler, eviction loop, flush/status API
  readthrough.py  ranged-GET fetches into the store, shared and read ahead
  importer.py     bucket listing -> ABSENT files (local data always wins)
  stats.py        counters
"""
