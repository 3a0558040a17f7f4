# Shell helpers for commands running in the kernel-client guest: . "$KCLIENT_GUEST_LIB"

# kc_mount [DIR] [EXTRA_OPTS]: mount the export like the harness does (for KernelClient(mount=False)).
kc_mount() {
	mount -i -t nfs4 -o "$KCLIENT_NFS_OPTS${2:+,$2}" "$KCLIENT_NFS_SOURCE" "${1:-$KCLIENT_MNT}"
}

# kc_host_call NAME [TIMEOUT_S]: ask the host to run host_calls[NAME] (KernelClient.run) and wait.
kc_host_call() {
	_n=$1 _t=${2:-120} _i=0
	: > "$KCLIENT_RUNDIR/call.$_n"
	while [ ! -e "$KCLIENT_RUNDIR/done.$_n" ]; do
		if [ -e "$KCLIENT_RUNDIR/failed.$_n" ]; then
			echo "host call $_n failed: $(cat "$KCLIENT_RUNDIR/failed.$_n")" >&2
			return 1
		fi
		_i=$((_i + 1))
		if [ $_i -gt $((_t * 5)) ]; then
			echo "host call $_n: no answer in ${_t}s" >&2
			return 1
		fi
		sleep 0.2
	done
}

# kc_drop_caches: write back and forget the guest page cache, so reads go to the server.
kc_drop_caches() {
	sync
	echo 3 > /proc/sys/vm/drop_caches
}
