"""Harness code that tests/ and bench/ both use (issue 39: bench/ does not import tests/).

Not part of ckptgw: pyproject.toml lists the packages the wheel ships and this is not one of
them, and the sdist leaves it out (MANIFEST.in). What lives here: the NFS test client
(`nfsclient`), the ops harness (`ops_harness`), `python -m nfsd` as a child process to kill
and restart (`crash_server`) or on a fixed port (`ckptgw_server`), `ckptgw serve` as a live
daemon (`appliance_live`), nfs-rs helpers (`nfsrs_support`), moto in server mode
(`motoserver`), the S3 fault proxy (`faultproxy`), the in-memory fake S3 of the simulation
(`fakes3`), loopback helpers (`loopback`), files written straight into a store
(`storefiles`), and the kernel-client VM and NFS-Ganesha (`kclient`).

pytest fixtures stay in tests/ (conftest.py, tests/support/fixtures.py); what is here is plain
code, importable from a benchmark as from a test.
"""
