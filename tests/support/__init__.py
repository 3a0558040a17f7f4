"""Shared test machinery: a moto S3 server subprocess and a fault-injecting HTTP proxy."""
