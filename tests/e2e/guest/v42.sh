#!/bin/sh
# NFSv4.2 sparse-file and server-side-copy ops through the kernel client (one VM boot, vers=4.2):
# fallocate --punch-hole (DEALLOCATE), lseek SEEK_DATA/SEEK_HOLE (SEEK), cp --reflink=always
# (CLONE), copy_file_range (COPY, synchronous and, for 80 MiB, asynchronous with CB_OFFLOAD). Each
# result is compared with the same operation on a local file.
# Also over 4.2: mkfifo, mknod and a bound unix socket (CREATE of every special type, as root), and
# flock and fcntl locks from two processes.
. "$(dirname "$0")/lib.sh"
W=$M/v42.$$
mkdir -p "$W"

punch_hole() {
	head -c 1048576 /dev/urandom > /tmp/p
	cp /tmp/p "$W/p"
	sync
	fallocate --punch-hole -o 65536 -l 131072 "$W/p"
	fallocate --punch-hole -o 65536 -l 131072 /tmp/p
	kc_drop_caches
	expect "size after punch" "$(stat -c %s "$W/p")" 1048576
	cmp /tmp/p "$W/p"
}

seek_data_hole() {
	python3 - "$W/s" <<'PY'
import errno, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.pwrite(fd, b"a" * 65536, 0)
os.pwrite(fd, b"b" * 65536, 1 << 20)
os.ftruncate(fd, 2 << 20)
os.fsync(fd)
got = [os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE),
       os.lseek(fd, 65536, os.SEEK_DATA), os.lseek(fd, 1 << 20, os.SEEK_HOLE)]
want = [0, 65536, 1 << 20, (1 << 20) + 65536]
assert got == want, (got, want)
try:
    os.lseek(fd, (1 << 20) + 65536, os.SEEK_DATA)
    raise SystemExit("SEEK_DATA in the trailing hole found data")
except OSError as e:
    assert e.errno == errno.ENXIO, e
print("seek offsets", got)
PY
}

reflink() {
	head -c 3000000 /dev/urandom > /tmp/r
	cp /tmp/r "$W/r"
	sync
	cp --reflink=always "$W/r" "$W/r.clone"
	kc_drop_caches
	cmp /tmp/r "$W/r.clone"
}

# copy_range SIZE: copy_file_range of a SIZE-byte file (a small one is a synchronous COPY; one of
# 64 MiB or more an asynchronous COPY the client waits on until the server's CB_OFFLOAD)
copy_range() {
	head -c "$1" /dev/urandom > /tmp/c
	cp /tmp/c "$W/c"
	sync
	python3 - "$W/c" "$W/c.copy" <<'PY'
import os, sys
src = os.open(sys.argv[1], os.O_RDONLY)
dst = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
left = os.fstat(src).st_size
while left:
    n = os.copy_file_range(src, dst, left)
    assert n > 0
    left -= n
os.fsync(dst)
PY
	kc_drop_caches
	cmp /tmp/c "$W/c.copy"
	rm "$W/c" "$W/c.copy" /tmp/c
}

special_files() {
	mkfifo "$W/fifo"
	mknod "$W/chr" c 1 3
	mknod "$W/blk" b 7 0
	python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$W/sock"
	mv "$W/fifo" "$W/fifo.moved"
	kc_drop_caches
	expect "fifo" "$(stat -c %F "$W/fifo.moved")" "fifo"
	expect "char device" "$(stat -c '%F %t:%T' "$W/chr")" "character special file 1:3"
	expect "block device" "$(stat -c '%F %t:%T' "$W/blk")" "block special file 7:0"
	expect "socket" "$(stat -c %F "$W/sock")" "socket"
	rm "$W/fifo.moved" "$W/chr" "$W/blk" "$W/sock"
	expect "after rm" "$(ls "$W" | grep -c -e fifo -e chr -e blk -e sock)" 0
}

# two processes, one lock: the second is refused while the first holds it, then gets it
two_process_locks() {
	F=$W/lockfile
	: > "$F"
	rm -f /tmp/lk.held
	( flock -x 9; : > /tmp/lk.held; sleep 4 ) 9>"$F" &
	holder=$!
	while [ ! -e /tmp/lk.held ]; do sleep 0.1; done
	if flock -n "$F" true; then echo "flock: a second process took a held lock" >&2; return 1; fi
	wait $holder
	flock -n "$F" true
	python3 - "$F" <<'PY'
import fcntl, os, sys, time
path = sys.argv[1]
r, w = os.pipe()
pid = os.fork()
if pid == 0:                                  # the holder: bytes 0-99, until told to let go
    fd = os.open(path, os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX, 100, 0)
    os.write(w, b"x")
    time.sleep(3)
    os._exit(0)
os.read(r, 1)
fd = os.open(path, os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 50)
    raise SystemExit("fcntl: an overlapping range was granted to a second process")
except OSError:
    pass
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 100)   # a range beside it is free
os.waitpid(pid, 0)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 50)     # the holder exited: granted
print("fcntl ranges ok")
PY
}

check mount-vers mount_vers
check punch-hole punch_hole
check seek-data-hole seek_data_hole
check reflink reflink
check copy copy_range 2000000
check copy-async copy_range 83886080
check special-files special_files
check two-process-locks two_process_locks
finish
