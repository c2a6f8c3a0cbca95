#!/usr/bin/env bash
# One-time host set-up for vmseed's tests, e2e and benchmarks (Debian 12, root).
# Idempotent: safe to run again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-host: run as root (apt-get and libvirtd need it)" >&2
  exit 2
fi
mapfile -t pkgs < <(grep -v '^\s*#' "$here/deb-packages.txt" | grep -v '^\s*$')
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
# A line `a | b` is satisfied by any one of them; the first is installed.
missing=()
for line in "${pkgs[@]}"; do
  IFS='|' read -ra alts <<< "$line"
  ok=
  for a in "${alts[@]}"; do
    a="${a//[[:space:]]/}"
    if installed "$a"; then ok=1; break; fi
  done
  [ -n "$ok" ] || missing+=("${alts[0]//[[:space:]]/}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup-host: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# cloud-init is installed for its parsers only: it must never act on this host.
mkdir -p /etc/cloud
touch /etc/cloud/cloud-init.disabled
# libvirtd without systemd, as root: without user/group = root every define
# takes ~45 s while libvirt re-probes QEMU against a root-only /dev/kvm.
conf=/etc/libvirt/qemu.conf
for kv in 'user = "root"' 'group = "root"'; do
  grep -qxF "$kv" "$conf" || echo "$kv" >> "$conf"
done
# cloud-init's own JSON schemas (Debian 12's 22.4 and 13's 25.1), from the
# Debian mirror: the agent validates users' cloud-config against them.
bash "$here/fetch-cloud-init-schemas.sh" /usr/share/vmseed/cloud-init-schemas
echo "setup-host: done"
