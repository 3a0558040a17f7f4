#!/bin/busybox sh
# /init of the ckptgw kernel-client VM (PID 1 in the initramfs built by testkit/kclient/image.py).
# Loads the NFS and virtio modules, mounts the host root read-only over 9p with a tmpfs overlay on
# top, brings up slirp networking, mounts the NFS export (unless told not to) and runs
# /kclient/run.sh chrooted into the overlaid host root, its stdout/stderr on two virtio-serial ports.
# Everything the host wants is in /kc/config (the run dir, a writable 9p share); results go back
# there as small files (rc, t_*, mount.log, dmesg.txt) that testkit/kclient/vm.py reads.

/bin/busybox mkdir -p /proc /sys /dev /bin /sbin /usr/bin /usr/sbin
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null

uptime_s() { cut -d' ' -f1 /proc/uptime; }
log() { echo "kclient-init[$(uptime_s)]: $*" > /dev/console; }
halt_now() {
	sync
	echo o > /proc/sysrq-trigger
	poweroff -f
	sleep 10
}
die() {
	log "FATAL: $*"
	if grep -q ' /kc 9p ' /proc/mounts; then
		echo "$*" > /kc/init-error
		dmesg > /kc/dmesg.txt 2>/dev/null
	fi
	halt_now
}

# busybox insmod does not apply "module.param=value" from the kernel command line: pass them.
modparams() {
	for x in $(cat /proc/cmdline); do
		case "$x" in "$1".*=*) echo "${x#"$1".}" ;; esac
	done
}
while read -r m; do
	[ -n "$m" ] || continue
	n=${m##*/}; n=${n%.ko}; n=$(echo "$n" | tr - _)
	insmod "/lib/modules/$m" $(modparams "$n") 2>/dev/null || log "insmod $m failed (built in?)"
done < /modules.order

mkdir -p /host /kc /ovl /newroot
# virtio devices probe asynchronously: wait until the 9p tag shows up.
i=0
while [ $i -lt 100 ]; do
	grep -qs kcrun /sys/bus/virtio/drivers/9pnet_virtio/virtio*/mount_tag && break
	sleep 0.05; i=$((i + 1))
done
NINEP_OPTS="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$NINEP_OPTS" kcrun /kc || die "cannot mount the kcrun 9p share"
[ -r /kc/config ] || die "/kc/config missing"
. /kc/config
uptime_s > /kc/t_init
mount -t 9p -o "$NINEP_OPTS,ro,cache=loose" hostroot /host || die "cannot mount the hostroot 9p share"
mount -t tmpfs -o mode=0755,size=$KC_OVERLAY_SIZE tmpfs /ovl || die "tmpfs"
mkdir -p /ovl/upper /ovl/work
mount -t overlay -o lowerdir=/host,upperdir=/ovl/upper,workdir=/ovl/work overlay /newroot ||
	die "overlay mount of the host root failed"
for d in proc sys dev run tmp kclient "${KC_MNT#/}"; do mkdir -p "/newroot/$d"; done
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
# A fresh /tmp, except the host paths under /tmp the run needs (the repository, the Python
# environment, the working directory): keep the overlay's view of those, writable in guest RAM.
n=0
for p in $KC_TMP_KEEP; do
	mkdir -p "/ovl/keep$n" && mount --bind "/newroot$p" "/ovl/keep$n" || die "cannot keep $p"
	n=$((n + 1))
done
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp
n=0
for p in $KC_TMP_KEEP; do
	mkdir -p "/newroot$p" && mount --bind "/ovl/keep$n" "/newroot$p" || die "cannot keep $p"
	n=$((n + 1))
done
mount --bind /kc /newroot/kclient
rm -f /newroot/etc/mtab; ln -s /proc/self/mounts /newroot/etc/mtab
# NFSv4 owners "name@domain": same domain as the host tools' default
rm -f /newroot/etc/idmapd.conf
printf '[General]\nDomain = localdomain\n' > /newroot/etc/idmapd.conf
hostname "$KC_HOSTNAME"
echo "$KC_HOSTNAME" > /newroot/etc/hostname
ip link set lo up
ip addr add "$KC_GUEST_IP/24" dev eth0 || die "no eth0 (virtio_net not loaded?)"
ip link set eth0 up
# No default route on purpose: the guest reaches only slirp's forward to the host's server port.

OUT=/dev/null; ERR=/dev/null
i=0
while [ $i -lt 100 ]; do
	for p in /sys/class/virtio-ports/*; do
		[ -r "$p/name" ] || continue
		case "$(cat "$p/name")" in
		kclient.stdout) OUT=/dev/${p##*/} ;;
		kclient.stderr) ERR=/dev/${p##*/} ;;
		esac
	done
	[ -e "$OUT" ] && [ -e "$ERR" ] && [ "$OUT" != /dev/null ] && [ "$ERR" != /dev/null ] && break
	sleep 0.05; i=$((i + 1))
done
echo 6 > /proc/sys/kernel/printk

MOUNTED=0
if [ "$KC_DO_MOUNT" = 1 ]; then
	log "mounting $KC_NFS_SOURCE on $KC_MNT (-o $KC_NFS_OPTS)"
	# util-linux mount -i: kernel text options, no mount.nfs helper needed
	if chroot /newroot /bin/mount -i -t nfs4 -o "$KC_NFS_OPTS" "$KC_NFS_SOURCE" "$KC_MNT" > /kc/mount.log 2>&1; then
		MOUNTED=1
	else
		echo "$?" > /kc/mount-failed
		log "NFS mount failed: $(cat /kc/mount.log)"
	fi
fi

if [ "$KC_DO_MOUNT" != 1 ] || [ $MOUNTED = 1 ]; then
	uptime_s > /kc/t_cmd_start
	chroot /newroot /usr/bin/env -i /bin/sh /kclient/run.sh < /dev/null > "$OUT" 2> "$ERR"
	rc=$?
	uptime_s > /kc/t_cmd_end
	echo "$rc" > /kc/rc.tmp && mv /kc/rc.tmp /kc/rc
fi

sync
nfs_mounts() { awk '$3 ~ /^nfs/ { print $2 }' /proc/mounts | sort -r; }
if [ -n "$(nfs_mounts)" ]; then
	# Unmount every NFS mount (also ones the command made) so that the server sees a clean
	# DESTROY_SESSION/DESTROY_CLIENTID; umount can hang on a dead server, so bound the wait.
	for m in $(nfs_mounts); do umount "$m" >> /kc/umount.log 2>&1 & done
	i=0
	while [ $i -lt $((KC_UMOUNT_WAIT * 10)) ] && [ -n "$(nfs_mounts)" ]; do
		sleep 0.1; i=$((i + 1))
	done
	[ -n "$(nfs_mounts)" ] && echo "timeout after ${KC_UMOUNT_WAIT}s" >> /kc/umount.log
fi
dmesg > /kc/dmesg.txt
halt_now
