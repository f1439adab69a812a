/**
 * The guest's /init (busybox sh, in the initramfs). Independent of the VMM: it finds its
 * disks by label and its agent port by name, so a Firecracker driver boots the same image.
 *
 * 1. loads the kernel modules the initramfs carries (Debian builds virtio, ext4, overlay as modules);
 * 2. mounts the template disk (read-only) under an overlay whose writable layer is the sandbox's
 *    own disk (`space.disk=1`: an ext4 disk labelled `space-disk`, so files do not count
 *    against memory and a full disk is ENOSPC) or, without one, a tmpfs in guest RAM like
 *    gVisor's `--overlay2=root:memory` (a full-machine snapshot then holds the files); and the
 *    agent runtime disk at /.space;
 * 3. sets the hostname and the non-root user's process limit from the kernel command line;
 * 4. switches root and runs the agent (out of reach of the guest's OOM killer) on the
 *    virtio-serial port named `space-agent`.
 */
export const GUEST_INIT = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /newroot /lower /rw /rt
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
die() { echo "SPACE_INIT_FAILED $*"; sleep 1; poweroff -f; }
for m in $(cat /etc/modules.order); do insmod /lib/modules/$m 2>/dev/null; done
arg() { for a in $(cat /proc/cmdline); do case "$a" in "$1="*) echo "\${a#*=}";; esac; done; }
ID=$(arg space.id); NPROC=$(arg space.nproc); MEM=$(arg space.rwmb); WANTDISK=$(arg space.disk)
# A disk by its ext4 label (s_volume_name, at byte 1144); busybox has no blkid.
disk() { for b in /sys/block/vd*; do [ "$(dd if=/dev/\${b##*/} bs=1 skip=1144 count=16 2>/dev/null | tr -d '\\000')" = "$1" ] && echo /dev/\${b##*/}; done; }
n=0; while [ -z "$(disk space-root)" ] && [ $n -lt 100 ]; do usleep 20000; n=$((n+1)); done
ROOT=$(disk space-root); RT=$(disk space-rt)
[ -n "$ROOT" ] && [ -n "$RT" ] || die "disks not found (block devices: $(ls /sys/block | tr '\\n' ' '); modules: $(cut -d' ' -f1 /proc/modules | tr '\\n' ' '))"
mount -t ext4 -o ro,noload "$ROOT" /lower || die "cannot mount the template disk"
if [ "$WANTDISK" = 1 ]; then
  n=0; while [ -z "$(disk space-disk)" ] && [ $n -lt 100 ]; do usleep 20000; n=$((n+1)); done
  DISK=$(disk space-disk)
  [ -n "$DISK" ] || die "the sandbox disk was not found (block devices: $(ls /sys/block | tr '\\n' ' '))"
  mount -t ext4 -o noatime "$DISK" /rw || die "cannot mount the sandbox disk"
else
  mount -t tmpfs -o size=\${MEM:-256}m,mode=755 rw /rw
fi
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot || die "cannot mount the overlay"
mkdir -p /newroot/.space /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/run
mount -t ext4 -o ro,noload "$RT" /newroot/.space || die "cannot mount the agent runtime"
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /newroot/dev/pts
ln -sf pts/ptmx /newroot/dev/ptmx 2>/dev/null
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
[ -n "$ID" ] && hostname "$ID"
ip link set lo up
PORT=""; n=0
while [ -z "$PORT" ] && [ $n -lt 250 ]; do
  for p in /newroot/sys/class/virtio-ports/*; do [ "$(cat $p/name 2>/dev/null)" = space-agent ] && PORT=/dev/\${p##*/}; done
  [ -z "$PORT" ] && usleep 20000; n=$((n+1))
done
[ -n "$PORT" ] || die "no agent port"
echo -1000 > /newroot/proc/self/oom_score_adj
[ -n "$NPROC" ] && ulimit -u "$NPROC"
ulimit -n 65536
echo "SPACE_INIT_READY $(cut -d' ' -f1 /newroot/proc/uptime)"
export SPACE_SANDBOX_ID="$ID" SPACE_AGENT_PORT="$PORT" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root
exec switch_root /newroot /.space/lib/ld-linux-x86-64.so.2 --library-path /.space/lib /.space/node --single-threaded --max-semi-space-size=1 --max-old-space-size=96 /.space/agent.cjs
`;
