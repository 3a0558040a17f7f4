"""Benchmarks of ckptgw against reference implementations, and the issue-15 report (bench.report)."""
