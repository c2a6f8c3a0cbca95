// Virtlet's user-data merge (Mirantis/virtlet pkg/utils/merge.go `Merge`):
// mappings merge recursively, lists are concatenated (base then override),
// and anything else — scalars, null, or two values of different kinds —
// takes the override. No cloud-init merger string does that (cloud-init
// doc/rtd/reference/merging.rst, cloudinit/mergers/m_dict.py, m_list.py),
// so it is done here, before cloud-init sees the data.
// Keys are data: a `__proto__` or `constructor` key in user-data or
// meta-data is merged and written like any other key (spread and setKey
// define own properties) instead of replacing the object's prototype, where
// it vanished from meta-data and made the YAML dumper throw.
import { isPlainObject, setKey } from '../yaml.ts';

/** How a later user-data part goes over the earlier: Virtlet's merge, or top-level keys replaced. */
export type MergeMode = 'merge' | 'overwrite';

/**
 * `override` merged over `base` as Virtlet merges (header); `key: null` deletes the key. Builds new
 * mappings and lists and leaves its arguments as they were.
 */
export function virtletMerge(base: unknown, override: unknown): unknown {
  if (isPlainObject(base) && isPlainObject(override)) {
    const out: Record<string, unknown> = { ...base };
    for (const [k, v] of Object.entries(override)) {
      if (!Object.hasOwn(base, k)) setKey(out, k, v);
      // Go's reflect.SetMapIndex with the invalid value that merging into a
      // nil interface yields deletes the key: `key: null` removes a key.
      else if (v === null) delete out[k];
      else setKey(out, k, virtletMerge(base[k], v));
    }
    return out;
  }
  if (Array.isArray(base) && Array.isArray(override)) return [...(base as unknown[]), ...(override as unknown[])];
  return override;
}

// `userDataMerge: overwrite` (VirtletCloudInitUserDataOverwrite): top-level
// keys of the override replace the base's whole.
export function mergeCloudConfig(
  base: Record<string, unknown>,
  override: Record<string, unknown>,
  mode: MergeMode,
): Record<string, unknown> {
  if (mode === 'overwrite') return { ...base, ...override };
  return virtletMerge(base, override) as Record<string, unknown>;
}
