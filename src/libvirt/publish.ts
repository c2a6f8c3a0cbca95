// Where the domain's QEMU finds the seed image. With libvirt on the host the
// image in the agent's state directory is already visible (identity). In
// KubeVirt each VM's QEMU runs in its virt-launcher pod, which does not mount
// the agent's state directory; the image is copied into a directory of that
// pod instead: its `hotplug-disks` emptyDir, the one virt-handler bind-mounts
// KubeVirt's own hot-plugged disk images into (owned by qemu, uid 107), seen
// in the launcher at /var/run/kubevirt/hotplug-disks.
import * as nodeFs from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { basename, join } from 'node:path';
import { VmseedError } from '../errors.ts';
import { checkTemplate, renderForTarget, TARGET_PLACEHOLDERS, usesPodUID } from './template.ts';
import type { InjectionTarget } from './types.ts';

export interface ImagePublisher {
  // Makes the image available to the target's domain; returns the host path
  // of the copy the domain will open ({path} of --image-path-in-domain).
  publish(target: InjectionTarget, imagePath: string): Promise<string>;
  // Removes what publish() placed (after the disk is detached).
  unpublish(target: InjectionTarget): Promise<void>;
  // Removes what publish() placed for the target except `keepPath` (a
  // publish() result), once the domain's disk points at it.
  prune?(target: InjectionTarget, keepPath: string): Promise<void>;
  // It lives in the launcher pod (its directory names {podUID}).
  readonly perPod?: boolean;
}

export const identityPublisher: ImagePublisher = {
  publish: async (_target, imagePath) => imagePath,
  unpublish: async () => {},
};

// The fs calls DirPublisher makes (tests may pass faults).
export interface PublishFs {
  stat(path: string): Promise<{ isDirectory(): boolean }>;
  readFile(path: string): Promise<Uint8Array>;
  writeFile(path: string, data: Uint8Array, options: { mode: number; flag: string }): Promise<void>;
  chmod(path: string, mode: number): Promise<void>;
  rename(from: string, to: string): Promise<void>;
  unlink(path: string): Promise<void>;
  readdir(path: string): Promise<string[]>;
}

export interface DirPublisherOptions {
  // e.g. `/pods/{podUID}/volumes/kubernetes.io~empty-dir/hotplug-disks`.
  dirTemplate: string;
  // Our files are `vmseed-<basename of the store's image>`, i.e.
  // `vmseed-<datasource>-<sha16>.iso`: content-addressed like the store's, so
  // a changed seed is a new path the injector replaces the disk with (QEMU
  // keeps the old inode open; an in-place replace would go unseen). KubeVirt's
  // own entries there are `<volume>.img` files and `<volume>` directories,
  // and volume names cannot contain a dot, so the names never meet.
  prefix?: string;
  fileMode?: number;
  fs?: PublishFs;
}

const TMP_MARK = '.vmseed-tmp-';

function errCode(e: unknown): string | undefined {
  return (e as { code?: string }).code;
}

export class DirPublisher implements ImagePublisher {
  readonly #dirTemplate: string;
  readonly #prefix: string;
  readonly #mode: number;
  readonly #fs: PublishFs;
  readonly perPod: boolean;

  constructor(options: DirPublisherOptions) {
    checkTemplate('publishDir', options.dirTemplate, TARGET_PLACEHOLDERS);
    this.perPod = usesPodUID(options.dirTemplate);
    this.#dirTemplate = options.dirTemplate;
    this.#prefix = options.prefix ?? 'vmseed-';
    // Seeds may carry passwords: owner and group only. The agent runs as
    // the launcher's qemu user (107), so QEMU opens its own file.
    this.#mode = options.fileMode ?? 0o640;
    this.#fs = options.fs ?? (nodeFs as unknown as PublishFs);
  }

  dirFor(target: InjectionTarget): string {
    return renderForTarget(this.#dirTemplate, target);
  }

  async publish(target: InjectionTarget, imagePath: string): Promise<string> {
    const dir = this.dirFor(target);
    const dest = join(dir, this.#prefix + basename(imagePath));
    const fs = this.#fs;
    // Never created here: the directory is the launcher pod's volume, and
    // one that is missing means the pod is not there (yet) or the template
    // is wrong.
    const isDir = await fs.stat(dir).then((s) => s.isDirectory(), (e) => {
      if (errCode(e) === 'ENOENT') return false;
      throw this.#failed(`cannot stat publish directory ${dir}`, e);
    });
    if (!isDir) {
      throw new VmseedError('SEED_PUBLISH_FAILED', `publish directory ${dir} does not exist (launcher pod not started yet, or check --publish-dir and that the kubelet pods directory is mounted); will retry`, { kind: 'retryable', field: 'publishDir' });
    }
    try {
      const bytes = await fs.readFile(imagePath);
      const current = await fs.readFile(dest).catch((e) => {
        if (errCode(e) === 'ENOENT') return undefined;
        throw e;
      });
      // Identical (the name says so, the bytes confirm): keep the file.
      if (current !== undefined && Buffer.from(current).equals(Buffer.from(bytes))) return dest;
      const tmp = join(dir, `.${basename(dest)}${TMP_MARK}${randomBytes(6).toString('hex')}`);
      try {
        await fs.writeFile(tmp, bytes, { mode: this.#mode, flag: 'wx' });
        await fs.chmod(tmp, this.#mode); // the umask filtered writeFile's mode
        await fs.rename(tmp, dest);
      } catch (e) {
        await fs.unlink(tmp).catch(() => {});
        throw e;
      }
      return dest;
    } catch (e) {
      throw this.#failed(`cannot copy the seed image into ${dir}`, e);
    }
  }

  async unpublish(target: InjectionTarget): Promise<void> {
    await this.#removeOurs(target, undefined);
  }

  // Older seeds' copies, once the domain uses `keepPath`.
  async prune(target: InjectionTarget, keepPath: string): Promise<void> {
    await this.#removeOurs(target, basename(keepPath));
  }

  async #removeOurs(target: InjectionTarget, keep: string | undefined): Promise<void> {
    const dir = this.dirFor(target);
    // ENOENT: never published, or the pod (and its emptyDir) is gone.
    const gone = (e: unknown) => errCode(e) === 'ENOENT' || errCode(e) === 'ENOTDIR';
    const names = await this.#fs.readdir(dir).catch((e) => {
      if (gone(e)) return [] as string[];
      throw this.#failed(`cannot list publish directory ${dir}`, e);
    });
    // Ours only (and temporaries a crash left): KubeVirt's entries there
    // never carry the prefix. Injections of one domain are serialized, so no
    // temporary of a publish in progress is here when prune runs.
    for (const n of names.filter((n) => n !== keep && (n.startsWith(this.#prefix) || n.startsWith(`.${this.#prefix}`)))) {
      await this.#fs.unlink(join(dir, n)).catch((e) => {
        if (!gone(e)) throw this.#failed(`cannot remove the seed image from ${dir}`, e);
      });
    }
  }

  #failed(what: string, e: unknown): VmseedError {
    if (e instanceof VmseedError) return e;
    return new VmseedError('SEED_PUBLISH_FAILED', `${what}: ${errCode(e) ?? 'I/O error'}; will retry`, { kind: 'retryable', cause: e });
  }
}
