#!/usr/bin/env bash
# The native RPC layer (nfsd/native/rpc.pyx) under AddressSanitizer: tests/fuzz/asan.sh rpc.
#
#   tests/fuzz/asan_rpc.sh [INPUTS [SEED]]     default 20000 inputs, seed 37
exec bash "$(dirname "$0")/asan.sh" rpc "$@"
