#!/bin/sh
# Survive a server restart (KernelClient(mount=False), one VM boot): mount, write a tree, a
# checkpoint and a renamed-into-place file, unmount; the host restarts the server (same cache
# dir); mount again and verify everything, then write and verify again on the restarted server.
. "$(dirname "$0")/lib.sh"
W=$M/restart

before() {
	kc_mount
	mkdir "$W"
	$FSOPS mktree "$W/tree"
	$FSOPS checkpoint "$W/ckpt" 2 2 2
	echo "final" > "$W/state.tmp"
	mv "$W/state.tmp" "$W/state"
	chmod 600 "$W/state"
	ln -s state "$W/state-link"
	sync
	$FSOPS manifest "$W" > /tmp/before.json
	umount "$M"
}

after() {
	kc_mount
	$FSOPS manifest "$W" > /tmp/after.json
	cmp /tmp/before.json /tmp/after.json || { diff /tmp/before.json /tmp/after.json | head -30; return 1; }
	$FSOPS verify-checkpoint "$W/ckpt" 2 2 2 restart-checkpoint-readback
	# the restarted server must take new writes, renames and removals too
	$FSOPS checkpoint "$W/ckpt2" 1 2 1
	$FSOPS verify-checkpoint "$W/ckpt2" 1 2 1 after-restart-new-checkpoint
	rm -rf "$W"
	umount "$M"
}

check write-then-unmount before
check server-restart kc_host_call restart 180
check remount-verify after
finish
