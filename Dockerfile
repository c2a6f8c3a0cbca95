# vmseed agent image. Three stages on the same Node 24 slim base: `deps`
# installs the runtime dependencies, `schemas` fetches cloud-init's JSON
# schemas, the final stage adds virsh, the source and both.
# Pin by digest in release builds (FROM node:24.21-bookworm-slim@sha256:…): a
# tag can be re-pushed, a digest cannot. CI here has no registry access to
# resolve the digest, so the tag is pinned to a minor release.
# test/deploy/image.test.ts builds it with buildah and runs the image under
# the DaemonSet's security context; test/deploy/dockerfile.test.ts lints it.

FROM node:24.21-bookworm-slim AS deps
WORKDIR /opt/vmseed
COPY package.json package-lock.json ./
# Dev dependencies (TypeScript, the `node` npm package, test tools) stay out:
# the base image's Node runs the TypeScript sources directly. No cache clean:
# only node_modules leaves this stage. Type declarations and source maps are
# for editors and debuggers, not for Node: removed, they take about 40 MB
# (most of it @kubernetes/client-node's, which only a --kubeconfig run loads).
RUN npm ci --omit=dev --no-audit --no-fund \
 && find node_modules -type f \( -name '*.d.ts' -o -name '*.d.mts' -o -name '*.d.cts' -o -name '*.map' \) -delete

# cloud-init's own JSON schemas for validating users' cloud-config: Debian
# 12's (22.4) and 13's (25.1), from the cloud-init .debs on the Debian
# mirror (nothing vendored). A stage of its own so that apt's private state
# and the downloaded .debs stay out of the image; the script updates its own
# private package lists, so no apt-get update here.
FROM node:24.21-bookworm-slim AS schemas
COPY scripts/fetch-cloud-init-schemas.sh /usr/local/bin/
RUN bash /usr/local/bin/fetch-cloud-init-schemas.sh /usr/share/vmseed/cloud-init-schemas

FROM node:24.21-bookworm-slim
# virsh only (Debian's libvirt-clients): no daemon, no QEMU, no recommends.
# tini: PID 1 that reaps. The virsh timeout kills virsh's whole process
# group; its children's parent is gone, so they are re-parented to PID 1 and
# only PID 1 can reap them: Node reaps its own children only, so under Node
# as PID 1 they stay zombies. util-linux (flock) is essential in bookworm;
# named for the state directory's lock all the same. nftables: nft for
# `vmseed redirect` (deploy/imds), which runs from the same image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt-clients tini util-linux nftables \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/vmseed
COPY --from=deps /opt/vmseed/node_modules ./node_modules
COPY package.json ./
COPY bin ./bin
COPY src ./src
# Root-owned and world-readable (0644 files, 0755 directories): uid 107 reads them.
COPY --from=schemas /usr/share/vmseed/cloud-init-schemas /usr/share/vmseed/cloud-init-schemas
# bin/vmseed falls back to the `node` on PATH (the base image's Node 24)
# because --omit=dev leaves no node_modules/.bin/node.
RUN ln -s /opt/vmseed/bin/vmseed /usr/local/bin/vmseed
# uid 107 is the qemu user of KubeVirt's non-root virt-launcher, which owns
# the libvirt socket the agent talks to and reads the seed images. Root is
# needed only for root launchers or a host libvirtd in system mode: the
# DaemonSet then sets runAsUser: 0 (docs/operations.md).
RUN groupadd --system --gid 107 vmseed \
 && useradd --system --uid 107 --gid 107 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin vmseed
# Node's compile cache (node_modules/.cache/vmseed, see bin/vmseed), filled
# here so the agent starts without Node's TypeScript stripper (~18 MB less
# RSS for its whole life; the root filesystem is read-only at run time).
# Node keys the cache by uid: filled for root (runAsUser: 0 set-ups) and for
# 107, which owns the directory so that it can add its own.
RUN vmseed warm-cache \
 && chown 107:107 node_modules/.cache/vmseed
USER 107:107
RUN vmseed warm-cache
EXPOSE 8080
# tini forwards SIGTERM to the agent only (not -g): in-flight virsh calls
# get the agent's shutdown deadline instead of dying with it.
ENTRYPOINT ["tini", "--", "vmseed", "agent"]
