#!/bin/sh
# Runs INSIDE the kernel-client guest for bench/kclient_compare.py; prints `RESULT key value`.
#   env: DD_MIB, CKPT_FILES, CKPT_FILE_MIB, CKPT_PARALLEL
set -e
. "$KCLIENT_GUEST_LIB"
M=$KCLIENT_MNT
HERE=$(cd "$(dirname "$0")" && pwd)
now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.3f", e - s }'; }

rm -rf "$M/bench"
mkdir "$M/bench"
kc_drop_caches
s=$(now)
dd if=/dev/zero of="$M/bench/dd.bin" bs=1M count="$DD_MIB" conv=fsync 2> /dev/null
echo "RESULT dd_write_s $(since "$s")"
kc_drop_caches
s=$(now)
dd if="$M/bench/dd.bin" of=/dev/null bs=1M 2> /dev/null
echo "RESULT dd_read_s $(since "$s")"
rm "$M/bench/dd.bin"
sync
python3 "$HERE/kclient_ckpt_guest.py" "$M/bench/ckpt" "$CKPT_FILES" "$CKPT_FILE_MIB" "$CKPT_PARALLEL"
rm -rf "$M/bench"
