// What the agent consumes from src/cloudinit and src/disk, as narrow
// interfaces: the reconciler is wired to the real modules in the command
// and can be driven by anything with these shapes.
import type { Seed } from '../cloudinit/seed.ts';
import type { RefResolver, VmiObject, Datasource } from '../api/objects.ts';
import type { RenderContext, RenderOptions, RenderOutcome } from '../cloudinit/render.ts';
import type { SchemaCheckOptions } from '../cloudinit/render-options.ts';
import type { VendorDataRef } from '../cloudinit/userdata/vendor-data.ts';
import type { ImageKey, StoredImage as StoreEntry } from '../disk/store.ts';

export interface AgentRenderOptions {
  kubevirtVolumes: RenderOptions['kubevirtVolumes'];
  maxUserDataBytes: number;
  maxNetworkDataBytes: number;
  defaultVendorData?: VendorDataRef;
  // cloud-config checked against cloud-init's schemas (--cloud-init-version).
  schemaCheck?: SchemaCheckOptions;
  // The reconcile's signal (the stop deadline), set by the reconciler.
  signal?: AbortSignal;
}

/**
 * Renders a VMI's seed. `context`: facts from the domain, which the reconciler
 * passes only for the VMIs that need them (see devicesNeedingDomain).
 */
export type RenderSeed = (
  vmi: VmiObject,
  refs: RefResolver,
  options: AgentRenderOptions,
  context?: RenderContext,
) => Promise<RenderOutcome>;

export interface BuiltImage {
  bytes: Uint8Array;
  label: string;
  files: Array<{ path: string; size: number }>;
  sha256: string;
}

export type BuildSeedImage = (seed: Seed, timestamp: Date) => BuiltImage;

// What the reconciler needs of a stored image (it also makes these for
// cleanup, where the size is not known).
export type StoredImage = Omit<StoreEntry, 'size'>;

export interface SeedImageStore {
  write(
    key: ImageKey,
    datasource: Datasource,
    bytes: Uint8Array,
    options: { fsync: boolean; sha256?: string; signal?: AbortSignal },
  ): Promise<{ path: string; written: boolean }>;
  list(): Promise<StoredImage[]>;
  // Removes the VMI's images other than keepPath (older seeds).
  prune(key: ImageKey, keepPath: string): Promise<unknown>;
  remove(key: ImageKey): Promise<unknown>;
  cleanupTemporaries(): Promise<unknown>;
  // sha256 / lstat of one of its images, never through a symlink nor
  // opening a FIFO or device (undefined for those and for missing files).
  hashImage(path: string): Promise<string | undefined>;
  imageStat(path: string): Promise<{ size: number; mtimeMs: number } | undefined>;
}
