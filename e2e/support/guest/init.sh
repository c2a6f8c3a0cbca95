#!/bin/busybox sh
# /init of the vmseed busybox test guest. Reads vmseed.* from the kernel
# command line, finds the seed (a disk by label, or an HTTP base URL), prints
# the requested files on the console as base64 between marker lines, and
# powers off (or stays, to let hot-unplug tests see the guest answer).
/bin/busybox mkdir -p /bin /proc /sys /dev /mnt /tmp
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
# Kernel messages (hot-plug, driver probes) must not interleave with the dumps.
echo 1 >/proc/sys/kernel/printk

label=cidata
files=user-data,meta-data
wait=60
url=
after=poweroff
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    vmseed.label=*) label="${arg#vmseed.label=}" ;;
    vmseed.files=*) files="${arg#vmseed.files=}" ;;
    vmseed.wait=*) wait="${arg#vmseed.wait=}" ;;
    vmseed.url=*) url="${arg#vmseed.url=}" ;;
    vmseed.after=*) after="${arg#vmseed.after=}" ;;
  esac
done

uptime_s() { read u _ </proc/uptime; echo "$u"; }
uptime_int() { u=$(uptime_s); echo "${u%%.*}"; }

while read -r m; do
  insmod "/lib/modules/$m.ko" || echo "VMSEED-WARN insmod $m failed"
done </etc/vmseed-modules

echo "VMSEED-BOOTED $(uptime_s)"

emit() { # <name as requested> <local file>
  echo "VMSEED-FILE-BEGIN $1"
  base64 "$2"
  echo "VMSEED-FILE-END $1"
}

finish() {
  echo "VMSEED-DONE $(uptime_s)"
  if [ "$after" = stay ]; then
    # Stay alive (answering ACPI unplug) and report when the seed goes away.
    if [ -n "$dev" ]; then
      while findfs "LABEL=$label" >/dev/null 2>&1; do sleep 0.1; done
      echo "VMSEED-LABEL-GONE $(uptime_s)"
    fi
    while :; do sleep 3600; done
  fi
  sync
  poweroff -f
}

if [ -n "$url" ]; then
  i=0
  while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
  ip link set lo up
  ip link set eth0 up
  ip addr add 10.0.2.15/24 dev eth0
  ip route add default via 10.0.2.2
  echo "VMSEED-NET-UP $(uptime_s)"
  IFS=,
  for f in $files; do
    unset IFS
    if wget -q -T 10 -O /tmp/fetched "$url$f" 2>/dev/null; then
      emit "$f" /tmp/fetched
    else
      echo "VMSEED-FILE-MISSING $f"
    fi
    rm -f /tmp/fetched
  done
  unset IFS
  dev=
  finish
fi

deadline=$(($(uptime_int) + wait))
dev=
while :; do
  dev=$(findfs "LABEL=$label" 2>/dev/null) && [ -n "$dev" ] && break
  dev=
  [ "$(uptime_int)" -ge "$deadline" ] && break
  sleep 0.1
done
if [ -z "$dev" ]; then
  echo "VMSEED-LABEL-TIMEOUT $label $(uptime_s)"
  finish
fi
echo "VMSEED-LABEL-FOUND $dev $(uptime_s)"
if ! mount -t iso9660 -o ro "$dev" /mnt; then
  echo "VMSEED-MOUNT-FAILED $dev"
  finish
fi
IFS=,
for f in $files; do
  unset IFS
  if [ -f "/mnt/$f" ]; then emit "$f" "/mnt/$f"; else echo "VMSEED-FILE-MISSING $f"; fi
done
unset IFS
umount /mnt
finish
