#!/bin/sh
# NFSv4.2 sparse-file and server-side-copy ops through the kernel client (one VM boot, vers=4.2):
# fallocate --punch-hole (DEALLOCATE), lseek SEEK_DATA/SEEK_HOLE (SEEK), cp --reflink=always
# (CLONE), copy_file_range (COPY). Each result is compared with the same operation on a local file.
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

copy_range() {
	head -c 2000000 /dev/urandom > /tmp/c
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
}

check mount-vers mount_vers
check punch-hole punch_hole
check seek-data-hole seek_data_hole
check reflink reflink
check copy copy_range
finish
