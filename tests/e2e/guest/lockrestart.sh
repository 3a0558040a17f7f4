#!/bin/sh
# A lock and an open file held across a gateway restart (KernelClient(mount=False), one VM boot):
# a process opens a file and holds an flock on it (the NFS client sends it as a LOCK) while the
# host restarts the server on the same cache dir; the client reclaims its open and lock in the
# server's grace period; the lock still excludes another process, and the holder's descriptor
# still writes. Then the lock is released and can be taken again.
. "$(dirname "$0")/lib.sh"
F=$M/held-lock

hold() {
	kc_mount
	echo before > "$F"
	# fd 9 stays open in the holder across the restart; it appends once /tmp/release exists.
	(
		exec 9>>"$F"
		flock -x 9
		: > /tmp/holder.locked
		while [ ! -e /tmp/release ]; do sleep 0.2; done
		echo after >&9
		: > /tmp/holder.wrote
		while [ ! -e /tmp/unlock ]; do sleep 0.2; done
	) </dev/null >/dev/null 2>&1 &   # not the check's output pipe: it would wait for the holder
	echo $! > /tmp/holder.pid
	i=0
	while [ ! -e /tmp/holder.locked ]; do i=$((i + 1)); must "$i" -lt 300; sleep 0.1; done
	if flock -n "$F" true; then echo "a second process took the lock" >&2; return 1; fi
}

reclaimed() {
	# An OPEN finds the new server instance; the client recovers (reclaim, RECLAIM_COMPLETE).
	kc_drop_caches
	cat "$F" > /dev/null
	if flock -n "$F" true; then echo "the lock was lost in the restart" >&2; return 1; fi
	# The server holds it too: another client (the host's) is refused it.
	kc_host_call lock-probe 120
}

held_fd_writes() {
	: > /tmp/release
	i=0
	while [ ! -e /tmp/holder.wrote ]; do i=$((i + 1)); must "$i" -lt 600; sleep 0.1; done
	sync
	expect content "$(cat "$F" | tr '\n' ' ')" "before after "
}

released() {
	: > /tmp/unlock
	i=0
	while kill -0 "$(cat /tmp/holder.pid)" 2>/dev/null; do i=$((i + 1)); must "$i" -lt 300; sleep 0.1; done
	flock -n "$F" true
	rm -f "$F"
	umount "$M"
}

check lock-held-before-restart hold
check server-restart kc_host_call restart 180
check lock-reclaimed reclaimed
check held-fd-writes held_fd_writes
check lock-released released
finish
