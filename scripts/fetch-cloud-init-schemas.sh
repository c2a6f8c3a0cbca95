#!/usr/bin/env bash
# Fetches cloud-init's own JSON schemas (cloud-config, network-config) from
# the cloud-init .deb of each Debian release vmseed validates against:
# bookworm (Debian 12, cloud-init 22.4.x) and trixie (Debian 13, 25.1.x).
# Nothing is vendored into the repository; this runs at host set-up
# (scripts/setup-host.sh) and in the image build (Dockerfile).
#
#   fetch-cloud-init-schemas.sh [DEST]   (default /usr/share/vmseed/cloud-init-schemas)
#
# Result: DEST/<major.minor>/{schema-*.json,versions.schema.cloud-config.json,release.json}.
# apt runs with a private state directory per suite (the same options as
# test/support/cloud-init-release.ts), so the host's sources, lists, pins and
# dpkg status are neither read nor touched. Needs apt-get, apt-cache and
# dpkg-deb only (root, or APT::Sandbox::User=root would not be allowed).
# Idempotent: a release whose release.json already names the version the
# mirror offers is left alone unless FORCE is set; if the mirror cannot be
# reached, an existing copy is kept. Each release directory is built beside
# DEST and moved into place, so readers never see a half-written one.
set -euo pipefail
umask 022

dest=${1:-/usr/share/vmseed/cloud-init-schemas}
mirror=http://deb.debian.org/debian
security=http://deb.debian.org/debian-security
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
schemas_in_deb=usr/lib/python3/dist-packages/cloudinit/config/schemas

log() { echo "fetch-cloud-init-schemas: $*" >&2; }

mkdir -p "$dest"
chmod 0755 "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d)
cleanup() {
  rm -rf "$work"
  rm -rf "$dest"/.tmp-*-$$ "$dest"/.old-*-$$
}
trap cleanup EXIT

# The sources lines of a suite's private apt state. bookworm's newest
# cloud-init can be a stable or security update: apt picks the highest.
sources_for() {
  local suite=$1 signed=
  # Trust exactly Debian's archive keys (bookworm's keyring package carries
  # trixie's too), whatever else the host's trusted.gpg.d holds.
  [ -r "$keyring" ] && signed="[signed-by=$keyring] "
  echo "deb ${signed}$mirror $suite main"
  if [ "$suite" = bookworm ]; then
    echo "deb ${signed}$mirror bookworm-updates main"
    echo "deb ${signed}$security bookworm-security main"
  fi
}

# Prints the existing release.json's "version" value, or nothing.
existing_version() {
  local f=$1
  [ -r "$f" ] || return 0
  sed -n 's/.*"version":"\([^"]*\)".*/\1/p' "$f"
}

# The release directory (DEST/<major.minor>) already holding this suite, if any.
existing_for_suite() {
  local suite=$1 f
  for f in "$dest"/*/release.json; do
    [ -r "$f" ] || continue
    if grep -q "\"suite\":\"$suite\"" "$f"; then
      dirname "$f"
      return 0
    fi
  done
  return 0
}

fetch_suite() {
  local suite=$1
  local state=$work/$suite
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/dl" "$state/x"
  sources_for "$suite" > "$state/sources.list"
  : > "$state/status"
  local opts=(
    -o "Dir::Etc::SourceList=$state/sources.list"
    -o Dir::Etc::SourceParts=/dev/null
    -o Dir::Etc::Preferences=/dev/null
    -o Dir::Etc::PreferencesParts=/dev/null
    -o "Dir::State::Lists=$state/lists"
    -o "Dir::State::status=$state/status"
    -o "Dir::Cache=$state/cache"
    -o APT::Sandbox::User=root
  )
  if ! apt-get -q "${opts[@]}" update >&2; then
    local have
    have=$(existing_for_suite "$suite")
    if [ -n "$have" ] && [ -z "${FORCE:-}" ]; then
      log "$suite: mirror unreachable, keeping $have"
      return 0
    fi
    log "$suite: apt-get update failed"
    return 1
  fi
  local version
  version=$(apt-cache "${opts[@]}" policy cloud-init | sed -n 's/^ *Candidate: *//p')
  if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    log "$suite: the mirror offers no cloud-init"
    return 1
  fi
  # 22.4.2-1+deb12u4 -> 22.4 (an epoch, if one ever appears, is dropped).
  local release
  release=$(echo "${version#*:}" | sed -n 's/^\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
  if [ -z "$release" ]; then
    log "$suite: cannot derive a release from version $version"
    return 1
  fi
  local target=$dest/$release
  if [ -z "${FORCE:-}" ] && [ "$(existing_version "$target/release.json")" = "$version" ]; then
    log "$suite: $target already holds cloud-init $version"
    return 0
  fi
  log "$suite: downloading cloud-init $version"
  (cd "$state/dl" && apt-get -q "${opts[@]}" download "cloud-init=$version" >&2)
  local debs=("$state"/dl/*.deb)
  if [ "${#debs[@]}" -ne 1 ] || [ ! -f "${debs[0]}" ]; then
    log "$suite: apt-get download left ${#debs[@]} .deb files"
    return 1
  fi
  local sha
  sha=$(sha256sum "${debs[0]}" | cut -d' ' -f1)
  dpkg-deb -x "${debs[0]}" "$state/x"
  local src=$state/x/$schemas_in_deb
  if [ ! -f "$src/schema-cloud-config-v1.json" ]; then
    log "$suite: cloud-init $version has no $schemas_in_deb/schema-cloud-config-v1.json"
    return 1
  fi
  local tmp=$dest/.tmp-$release-$$
  rm -rf "$tmp"
  mkdir "$tmp"
  local files=() f name
  for f in "$src"/*.json; do
    name=${f##*/}
    install -m 0644 "$f" "$tmp/$name"
    files+=("$name")
  done
  local sorted list=
  mapfile -t sorted < <(printf '%s\n' "${files[@]}" | LC_ALL=C sort)
  for name in "${sorted[@]}"; do list+="${list:+,}\"$name\""; done
  printf '{"release":"%s","package":"cloud-init","version":"%s","suite":"%s","sha256":"%s","files":[%s]}\n' \
    "$release" "$version" "$suite" "$sha" "$list" > "$tmp/release.json"
  chmod 0644 "$tmp/release.json"
  chmod 0755 "$tmp"
  # Swap in: the old directory is moved aside first (mv onto an existing
  # directory would move into it), then removed.
  if [ -e "$target" ]; then mv "$target" "$dest/.old-$release-$$"; fi
  mv "$tmp" "$target"
  rm -rf "$dest/.old-$release-$$"
  log "$suite: cloud-init $version -> $target (${sorted[*]})"
}

for suite in bookworm trixie; do
  fetch_suite "$suite"
done
