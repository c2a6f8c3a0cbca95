// The OpenStack metadata tree over HTTP, as cloud-init's MetadataReader
// (cloudinit/sources/helpers/openstack.py) and cloudbase-init walk it:
// `/openstack` lists versions (one per line; only `latest` here, which the
// reader falls back to), `/openstack/latest/` lists the files there, and
// each file has the bytes of the VMI's ConfigDrive seed
// (cloudinit/configdrive-view.ts), converted once per seed object.
import type { Seed } from '../cloudinit/seed.ts';
import { configDriveView, type ConfigDriveFiles } from '../cloudinit/configdrive-view.ts';
import type { ImdsReply } from './imds/identity-endpoint.ts';
import { OPENSTACK_FILES, type OpenstackPath } from './imds/imds-paths.ts';

const NOT_FOUND: ImdsReply = {
  status: 404,
  body: Buffer.from('not found\n'),
  headers: { 'Content-Type': 'text/plain; charset=utf-8' },
};

const ok = (body: Uint8Array, type: string): ImdsReply => ({ status: 200, body, headers: { 'Content-Type': type } });

/**
 * Answers the OpenStack tree from a VMI's seed; the ConfigDrive view is
 * built once per Seed object and dropped with it.
 */
export class OpenstackTree {
  readonly #views = new WeakMap<Seed, ConfigDriveFiles>();

  #view(seed: Seed): ConfigDriveFiles {
    let v = this.#views.get(seed);
    if (v === undefined) {
      v = configDriveView(seed);
      this.#views.set(seed, v);
    }
    return v;
  }

  reply(seed: Seed, path: OpenstackPath): ImdsReply {
    if (path.kind === 'versions') return ok(Buffer.from('latest\n'), 'text/plain; charset=utf-8');
    const view = this.#view(seed);
    if (path.kind === 'listing') {
      const names = OPENSTACK_FILES.filter((f) => view[f] !== undefined);
      return ok(Buffer.from(`${names.join('\n')}\n`), 'text/plain; charset=utf-8');
    }
    const bytes = view[path.file];
    if (bytes === undefined) return NOT_FOUND;
    return ok(bytes, path.file === 'user_data' ? 'application/octet-stream' : 'application/json');
  }
}
