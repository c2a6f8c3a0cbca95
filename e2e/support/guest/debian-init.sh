#!/bin/busybox sh
# /init of the Debian guest's initramfs: load virtio, mount /dev/vda (ext4 is
# built into the cloud kernel) and hand over to systemd.
/bin/busybox mkdir -p /bin /proc /sys /dev /newroot
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
while read -r m; do insmod "/lib/modules/$m.ko" || echo "vmseed-initramfs: insmod $m failed"; done </etc/vmseed-modules
i=0
while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if ! mount -t ext4 -o rw /dev/vda /newroot; then
  echo "vmseed-initramfs: cannot mount /dev/vda"
  sleep 2
  poweroff -f
fi
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
