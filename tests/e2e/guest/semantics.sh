#!/bin/sh
# File-system semantics through the kernel NFS client (one VM boot):
# tar a tree in and out, symlinks, hard links, truncate up/down, chmod, df, many entries.
# env: ENTRIES (default 10000)
. "$(dirname "$0")/lib.sh"
ENTRIES=${ENTRIES:-10000}
W=$M/semantics.$$
mkdir -p "$W"

tar_in_out() {
	$FSOPS mktree /tmp/src
	$FSOPS manifest /tmp/src > /tmp/src.json
	# tar in: unpack a stream onto NFS; tar out: pack from NFS (after dropping caches) and unpack locally
	mkdir "$W/tree"
	tar -C /tmp/src -cf - . | tar -C "$W/tree" -xpf -
	$FSOPS manifest "$W/tree" > /tmp/nfs.json
	cmp /tmp/src.json /tmp/nfs.json || { diff /tmp/src.json /tmp/nfs.json | head -20; return 1; }
	kc_drop_caches
	mkdir /tmp/back
	tar -C "$W/tree" -cf "$W/tree.tar" .
	kc_drop_caches
	tar -C /tmp/back -xpf "$W/tree.tar"
	$FSOPS manifest /tmp/back > /tmp/back.json
	cmp /tmp/src.json /tmp/back.json || { diff /tmp/src.json /tmp/back.json | head -20; return 1; }
	diff -r --no-dereference /tmp/src /tmp/back
}

symlinks() {
	cd "$W"
	echo target-data > target
	ln -s target rel-link
	ln -s "$W/target" abs-link
	ln -s nowhere dangling
	mkdir sdir
	ln -s sdir dir-link
	echo in-dir > dir-link/f
	kc_drop_caches
	expect "readlink rel" "$(readlink rel-link)" target
	expect "readlink abs" "$(readlink abs-link)" "$W/target"
	expect "read through link" "$(cat rel-link)" target-data
	expect "dir through link" "$(cat sdir/f)" in-dir
	must -L dangling
	must ! -e dangling
	expect "type" "$(stat -c %F rel-link)" "symbolic link"
	long=$(printf 'x%.0s' $(seq 1 1000))
	ln -s "$long" long-link
	expect "1000-byte target" "$(readlink long-link | wc -c)" 1001
	rm rel-link abs-link dangling dir-link long-link
	must -f target
}

hardlinks() {
	cd "$W"
	echo one > h1
	ln h1 h2
	mkdir hd
	ln h1 hd/h3
	kc_drop_caches
	expect "nlink after 2 links" "$(stat -c %h h1)" 3
	expect "same inode" "$(stat -c %i h2)" "$(stat -c %i h1)"
	echo two >> h2
	kc_drop_caches
	expect "write through one name, read through another" "$(cat hd/h3)" "$(printf 'one\ntwo')"
	rm h1
	expect "nlink after unlink" "$(stat -c %h h2)" 2
	expect "data survives unlink of a name" "$(cat h2)" "$(printf 'one\ntwo')"
	rm h2 hd/h3
	rmdir hd
}

truncate_up_down() {
	cd "$W"
	$FSOPS gen 1 trunc > t
	head -c 100 t > /tmp/t100
	truncate -s 3000000 t
	kc_drop_caches
	expect "size after truncate up" "$(stat -c %s t)" 3000000
	expect "tail after truncate up is zeros" "$(tail -c +1048577 t | tr -d '\0' | wc -c)" 0
	truncate -s 100 t
	kc_drop_caches
	expect "size after truncate down" "$(stat -c %s t)" 100
	cmp t /tmp/t100
	truncate -s 5000 t
	kc_drop_caches
	expect "re-extended bytes are zeros" "$(tail -c +101 t | tr -d '\0' | wc -c)" 0
	cmp -n 100 t /tmp/t100
	: > t
	expect "O_TRUNC" "$(stat -c %s t)" 0
	python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); os.ftruncate(fd, 12345); os.fsync(fd); os.close(fd)' t
	kc_drop_caches
	expect "ftruncate on an open file" "$(stat -c %s t)" 12345
}

chmod_modes() {
	cd "$W"
	echo x > m
	for mode in 600 640 755 444 4755 2750 1777 0 644; do
		chmod "$mode" m
		kc_drop_caches
		expect "chmod $mode" "$(stat -c %a m)" "$mode"
	done
	chmod u+x,g+w m
	expect "symbolic chmod" "$(stat -c %a m)" 764
	mkdir md
	chmod 711 md
	kc_drop_caches
	expect "dir mode" "$(stat -c %a md)" 711
	touch -d '2001-02-03 04:05:06' m
	kc_drop_caches
	expect "mtime set by touch -d" "$(date -r m +%Y%m%d%H%M%S)" 20010203040506
}

df_statfs() {
	df -k "$M"
	set -- $(df -kP "$M" | tail -1)
	must "$2" -gt 0
	must "$4" -gt 0
	stat -f "$M"
}

check mount-vers mount_vers
check tar-in-out tar_in_out
check symlinks symlinks
check hardlinks hardlinks
check truncate truncate_up_down
check chmod chmod_modes
check df df_statfs
check many-entries $FSOPS many-entries "$W/many" "$ENTRIES"
rm -rf "$W" || { echo "FAIL cleanup: rm -rf $W"; FAILS=$((FAILS + 1)); }
finish
