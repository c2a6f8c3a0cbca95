// The bytes the datasource answers for one file of a VMI's seed, with
// meta-data rendered once per seed (it is the only file built per request)
// and the empty vendor-data/network-config that spare cloud-init its retries.
import type { Seed } from '../cloudinit/seed.ts';
import { metaDataBytes } from '../cloudinit/seed-files.ts';
import { seedFileBytes, type DatasourceFile } from './files.ts';

export interface EmptyFileOptions {
  serveEmptyVendorData: boolean;
  serveEmptyNetworkConfig: boolean;
}

const EMPTY = new Uint8Array(0);

export class SeedFileBytes {
  readonly #metaDataCache = new WeakMap<Seed, Uint8Array>();
  readonly #empty: EmptyFileOptions;

  constructor(empty: EmptyFileOptions) {
    this.#empty = empty;
  }

  // Undefined when the answer is a 404.
  of(seed: Seed, file: DatasourceFile): Uint8Array | undefined {
    const bytes = this.#stored(seed, file);
    if (bytes !== undefined || seed.datasource !== 'nocloud') return bytes;
    if (file === 'vendor-data' && this.#empty.serveEmptyVendorData) return EMPTY;
    if (file === 'network-config' && this.#empty.serveEmptyNetworkConfig) return EMPTY;
    return undefined;
  }

  #stored(seed: Seed, file: DatasourceFile): Uint8Array | undefined {
    if (file !== 'meta-data' || seed.datasource !== 'nocloud') return seedFileBytes(seed, file);
    let b = this.#metaDataCache.get(seed);
    if (b === undefined) {
      b = metaDataBytes(seed);
      this.#metaDataCache.set(seed, b);
    }
    return b;
  }
}
