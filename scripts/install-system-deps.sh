#!/bin/bash
# install-system-deps.sh: the Debian packages ckptgw's tests need that pip cannot provide.
#
#   scripts/install-system-deps.sh            # kernel-client test harness + tools
#   scripts/install-system-deps.sh --bench    # also NFS-Ganesha (VFS FSAL) for bench/kclient_compare.py
#
# Idempotent and quiet: installs only what is missing, runs `apt-get update` only when an install
# fails (a stale or empty package list), logs apt's output to $CKPTGW_APT_LOG. Debian 12, as root.
#
# Packages: qemu-system-x86 (the VM), busybox-static (the guest initramfs), socat (slirp guestfwd to
# the host loopback), linux-image-amd64 (the guest kernel and its NFS modules), libnfs-utils (nfs-ls/
# nfs-cat for quick userspace checks), fio (benchmarks in the guest), iproute2 (`ip`: the HA pair's host
# bridge and taps, tests/ha/pairvm.py), promtool (see below); with --bench nfs-ganesha and
# nfs-ganesha-vfs (the reference server).
# busybox-static conflicts with the dynamic `busybox` package: when that one is installed we leave it
# alone (testkit/kclient unpacks busybox-static into its cache instead, without installing it).
set -euo pipefail

BENCH=0
for a in "$@"; do
	case "$a" in
	--bench) BENCH=1 ;;
	-h | --help)
		sed -n '2,15p' "$0"
		exit 0
		;;
	*)
		echo "install-system-deps.sh: unknown argument $a (use --bench or nothing)" >&2
		exit 2
		;;
	esac
done

LOG=${CKPTGW_APT_LOG:-/tmp/ckptgw-apt.log}

if [ "$(id -u)" != 0 ]; then
	echo "install-system-deps.sh: must run as root (apt-get install)" >&2
	exit 1
fi
if ! command -v apt-get > /dev/null || ! command -v dpkg-query > /dev/null; then
	echo "install-system-deps.sh: needs a Debian system (apt-get, dpkg-query)" >&2
	exit 1
fi

installed() {
	[ "$(dpkg-query -W -f '${Status}' "$1" 2> /dev/null)" = "install ok installed" ]
}

WANT=(qemu-system-x86 socat linux-image-amd64 libnfs-utils fio iproute2)
installed busybox || WANT+=(busybox-static)
[ $BENCH = 1 ] && WANT+=(nfs-ganesha nfs-ganesha-vfs)

# promtool (tests/packaging checks the Prometheus alert rules): only the binary, unpacked from Debian's
# `prometheus` package (19 MB), which installed would also start a Prometheus server on :9090.
install_promtool() {
	command -v promtool > /dev/null && return 0
	local tmp
	tmp="$(mktemp -d)"
	if ! (cd "$tmp" && apt-get download -q prometheus >> "$LOG" 2>&1); then
		apt-get update -q >> "$LOG" 2>&1 || true
		(cd "$tmp" && apt-get download -q prometheus >> "$LOG" 2>&1)
	fi
	dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
	install -m 0755 "$tmp/usr/bin/promtool" /usr/local/bin/promtool
	rm -rf "$tmp"
}
install_promtool

MISSING=()
for p in "${WANT[@]}"; do
	installed "$p" || MISSING+=("$p")
done
[ ${#MISSING[@]} = 0 ] && exit 0

echo "install-system-deps.sh: installing ${MISSING[*]} (log: $LOG)" >&2
export DEBIAN_FRONTEND=noninteractive
apt_install() {
	apt-get install -y -q --no-install-recommends "${MISSING[@]}" >> "$LOG" 2>&1
}
if ! apt_install; then
	apt-get update -q >> "$LOG" 2>&1 || true
	if ! apt_install; then
		echo "install-system-deps.sh: apt-get install ${MISSING[*]} failed; last lines of $LOG:" >&2
		tail -n 15 "$LOG" >&2
		exit 1
	fi
fi
