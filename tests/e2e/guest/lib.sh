# Shared by the guest drivers in this folder (sourced; runs in the kernel-client guest).
# Each check is a function run in a subshell with `set -e`; `check NAME FUNC` prints PASS/FAIL NAME
# (the host test parses these lines) and counts failures into FAILS.
. "$KCLIENT_GUEST_LIB"
HERE=$(cd "$(dirname "$0")" && pwd)
FSOPS="python3 $HERE/fsops.py"
M=${KCLIENT_MNT:-/mnt}
FAILS=0

check() {
	_name=$1
	shift
	_t0=$(date +%s)
	# not inside an `if`: there `set -e` would be ignored in the subshell too
	_out=$( (set -e; "$@") 2>&1)
	_rc=$?
	if [ $_rc = 0 ]; then
		echo "$_out" | grep -E '^(PASS|FAIL) ' || true
		echo "PASS $_name ($(($(date +%s) - _t0))s)"
	else
		echo "$_out" | sed 's/^/  | /' | tail -n 30
		echo "FAIL $_name: exit status $_rc after $(($(date +%s) - _t0))s (output above)"
		FAILS=$((FAILS + 1))
	fi
}

# expect WHAT GOT WANT: fail the current check with a message unless GOT = WANT.
expect() {
	if [ "$2" != "$3" ]; then
		echo "$1: got '$2', want '$3'" >&2
		return 1
	fi
}

# must TEST...: fail the current check unless the test holds (set -e ignores `a && b` failures).
must() {
	if ! test "$@"; then
		echo "check failed: test $*" >&2
		return 1
	fi
}

# mount_vers: the mount on $M negotiated the NFS version asked for ($KCLIENT_VERS), no fallback.
mount_vers() {
	line=$(grep " $M nfs4 " /proc/mounts)
	echo "$line"
	case "$line" in
	*"vers=$KCLIENT_VERS,"*) ;;
	*) echo "no vers=$KCLIENT_VERS mount on $M" >&2; return 1 ;;
	esac
}

finish() {
	echo "SUMMARY failures=$FAILS"
	exit $FAILS
}
