#!/bin/bash
# testkit/kclient/install.sh: install the kernel-client harness's Debian packages and build its boot
# image (initramfs + vmlinux) into the cache, so the first test does not pay for it.
#   testkit/kclient/install.sh [--bench]     (--bench: also NFS-Ganesha for bench/kclient_compare.py)
# Cache: $CKPTGW_KCLIENT_CACHE or /var/cache/ckptgw-kclient. Idempotent.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
bash "$ROOT/scripts/install-system-deps.sh" "$@"
cd "$ROOT"
python3 -c 'from testkit.kclient import ensure_ready; img = ensure_ready(); print("kclient ready:", img.kernel, img.initrd)'
