// The ServiceAccount token of a VMI's launcher pod, read from the kubelet's
// pods tree the agent mounts (--pods-dir): the token KubeVirt mounts into
// the launcher for a VMI with a serviceAccount volume, which is the
// `kube-api-access-<5>` projected volume the ServiceAccount admission adds
// (automountServiceAccountToken is set by KubeVirt only then).
//
// The kubelet writes projected volumes with its atomic writer: the file
// names are symlinks into `..data`, itself a symlink to a timestamped
// directory (`..2026_01_01_00_00_00.123456789`) swapped on every rotation.
// `<pods>/<pod>/volumes/kubernetes.io~projected` is the kubelet's alone
// (root, 0750, mounted into no container) and is opened by its path, the
// pod UID checked to be one (imds-facts.ts). Below it is the launcher's
// neighbourhood: the kubelet mounts projected volumes read-only into the
// pod, but the walk does not rely on that. Each component is opened through
// the previous directory's descriptor with O_NOFOLLOW (Node has no openat;
// /proc/self/fd/<fd>/<name> resolves from that inode), no symlink is
// followed but `..data`, and that one only to a plain timestamped name in
// the same directory; the token must be a regular file of at most 16 KiB.
// The token is returned, never kept or logged; only the volume's name is
// remembered per pod (it is fixed for the pod's life), so the directory is
// listed once.
import * as fs from 'node:fs';
import { constants as C } from 'node:fs';
import type { ImdsFacts } from '../../datasource/imds/identity-endpoint.ts';
import type { ServiceAccountTokenReader } from '../../datasource/imds/token-endpoint.ts';
import { isPodUid } from '../../libvirt/launcher-pod.ts';

const PROJECTED = 'kubernetes.io~projected';
// The ServiceAccount admission plugin's generated name (utilrand.String(5)).
const VOLUME_RE = /^kube-api-access-[a-z0-9]{5}$/;
// AtomicWriter's timestamped directory.
const DATA_DIR_RE = /^\.\.[0-9][0-9_.]{0,63}$/;
const MAX_TOKEN_BYTES = 16 * 1024;
// Pods whose volume name is remembered; beyond, the memory starts over.
const MAX_REMEMBERED = 4096;

const code = (e: unknown) => (e as NodeJS.ErrnoException).code;

function closeQuietly(fd: number | undefined): void {
  if (fd === undefined) return;
  try {
    fs.closeSync(fd);
  } catch {
    // Read-only descriptor: nothing to flush.
  }
}

// A directory below `dir` (a descriptor), never through a symlink.
function openDirBelow(dir: number, name: string): number {
  return fs.openSync(`/proc/self/fd/${dir}/${name}`, C.O_RDONLY | C.O_DIRECTORY | C.O_NOFOLLOW);
}

// The kubelet's directory lists the pod spec's projected volumes (a few).
function onlyVolume(dir: number): string | undefined {
  const found = fs.readdirSync(`/proc/self/fd/${dir}`).filter((n) => VOLUME_RE.test(n));
  return found.length === 1 ? found[0] : undefined;
}

function readRegular(dir: number, name: string): string | undefined {
  const fd = fs.openSync(`/proc/self/fd/${dir}/${name}`, C.O_RDONLY | C.O_NOFOLLOW | C.O_NONBLOCK);
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile() || st.size > MAX_TOKEN_BYTES) return undefined;
    const buf = Buffer.alloc(st.size);
    let off = 0;
    while (off < st.size) {
      const n = fs.readSync(fd, buf, off, st.size - off, off);
      if (n === 0) break;
      off += n;
    }
    return buf.subarray(0, off).toString('utf8');
  } finally {
    closeQuietly(fd);
  }
}

class VolumeNames {
  readonly #byPod = new Map<string, string>();

  of(pod: string, projected: number): string | undefined {
    let name = this.#byPod.get(pod);
    if (name === undefined) {
      name = onlyVolume(projected);
      if (name === undefined) return undefined;
      if (this.#byPod.size >= MAX_REMEMBERED) this.#byPod.clear();
      this.#byPod.set(pod, name);
    }
    return name;
  }

  forget(pod: string): void {
    this.#byPod.delete(pod);
  }
}

// One walk; throws errno errors (ENOENT while the kubelet rotates, or for
// a remembered volume name the pod no longer has).
function walk(podsDir: string, pod: string, names: VolumeNames): string | undefined {
  const held: number[] = [];
  try {
    held.push(fs.openSync(`${podsDir}/${pod}/volumes/${PROJECTED}`, C.O_RDONLY | C.O_DIRECTORY | C.O_NOFOLLOW));
    const volume = names.of(pod, held[0]);
    if (volume === undefined) return undefined;
    held.push(openDirBelow(held[held.length - 1], volume));
    const data = fs.readlinkSync(`/proc/self/fd/${held[held.length - 1]}/..data`);
    if (!DATA_DIR_RE.test(data)) return undefined;
    held.push(openDirBelow(held[held.length - 1], data));
    return readRegular(held[held.length - 1], 'token');
  } finally {
    for (const fd of held) closeQuietly(fd);
  }
}

function readPodToken(podsDir: string, pod: string, names: VolumeNames): string | undefined {
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      return walk(podsDir, pod, names);
    } catch (e) {
      names.forget(pod);
      // ENOENT: the kubelet swapped `..data` between our reads; once more.
      if (code(e) !== 'ENOENT') return undefined;
    }
  }
  return undefined;
}

/**
 * Reads a VMI's launcher-pod ServiceAccount token from the kubelet's pods tree
 * under `podsDir` (--pods-dir), for the datasource. Undefined when no launcher
 * pod has one; never throws, and the token is never kept.
 */
export function launcherTokenReader(podsDir: string): ServiceAccountTokenReader {
  const names = new VolumeNames();
  return (vmi: { facts: ImdsFacts }) => {
    for (const pod of vmi.facts.launcherPods) {
      if (!isPodUid(pod)) continue;
      const token = readPodToken(podsDir, pod, names);
      if (token !== undefined && token.trim() !== '') return token;
    }
    return undefined;
  };
}
