#!/bin/sh
# Data integrity through the kernel NFS client (one VM boot): a big dd with conv=fsync read back
# after drop_caches, the checkpoint save pattern, and a reader racing a writer that replaces
# `latest` by rename.
# env: DD_MIB (256), DD_SHA (sha256 of `fsops.py gen DD_MIB dd`, computed by the host),
#      CKPT_STEPS (3), CKPT_RANKS (4), CKPT_MIB (4), LATEST_VERSIONS (200)
. "$(dirname "$0")/lib.sh"
DD_MIB=${DD_MIB:-256}
W=$M/data.$$
mkdir -p "$W"

dd_fsync_readback() {
	s=$(date +%s.%N)
	$FSOPS gen "$DD_MIB" dd | dd of="$W/big.bin" bs=1M iflag=fullblock conv=fsync 2>&1 | tail -1
	e=$(date +%s.%N)
	echo "dd write incl. generator: $(awk -v m="$DD_MIB" -v s="$s" -v e="$e" 'BEGIN { printf "%.1f", m / (e - s) }') MiB/s"
	kc_drop_caches
	expect "size" "$(stat -c %s "$W/big.bin")" $((DD_MIB * 1048576))
	s=$(date +%s.%N)
	got=$(sha256sum "$W/big.bin" | cut -d' ' -f1)
	e=$(date +%s.%N)
	echo "read back + sha256sum: $(awk -v m="$DD_MIB" -v s="$s" -v e="$e" 'BEGIN { printf "%.1f", m / (e - s) }') MiB/s"
	expect "sha256 read back through NFS vs host-computed" "$got" "$DD_SHA"
	rm "$W/big.bin"
}

[ -n "$DD_SHA" ] || { echo "FAIL dd: DD_SHA not given"; exit 1; }
check mount-vers mount_vers
check dd-fsync-readback dd_fsync_readback
check checkpoint $FSOPS checkpoint "$W/ckpt" "${CKPT_STEPS:-3}" "${CKPT_RANKS:-4}" "${CKPT_MIB:-4}"
check checkpoint-readback $FSOPS verify-checkpoint "$W/ckpt" "${CKPT_STEPS:-3}" "${CKPT_RANKS:-4}" "${CKPT_MIB:-4}"
check latest-race $FSOPS latest-race "$W/latest" "${LATEST_VERSIONS:-200}"
rm -rf "$W" || { echo "FAIL cleanup: rm -rf $W"; FAILS=$((FAILS + 1)); }
finish
