// Building user-data from Virtlet's and oVirt's pieces. Order:
//   generated (init, files) ← user-data from userDataFrom ← inline user-data
// each later part merged over the earlier with Virtlet's merge (mappings
// recursive, lists appended, scalars replaced) or, with
// `userDataMerge: overwrite`, by replacing top-level keys. `userDataScript`
// replaces user-data wholesale.
//
// When there is only one part, its bytes pass through untouched (a script,
// MIME or gzip user-data stays what it was, and seeds from KubeVirt's fields
// alone keep their exact bytes). Merging needs every part to be #cloud-config.
//
// Budget: every part is charged to the render's user-data budget before it
// is decoded or parsed, and the merged mapping is measured before it is
// serialised, so USERDATA_TOO_LARGE comes before the big strings exist.
import { VmseedError } from '../../errors.ts';
import { decodeBase64Strict } from '../base64.ts';
import type { UserDataFrom } from '../annotation/extras.ts';
import type { ObjectEntry } from '../refs/object-refs.ts';
import { detectUserDataKind } from './user-data-lint.ts';
import { mergeCloudConfig, type MergeMode } from './merge.ts';
import { base64DecodedUpperBound, type SeedBudget } from '../limits.ts';
import { dumpYaml, isPlainObject, measureExpanded, parseYaml, setKey, where } from '../yaml.ts';

/** One render's user-data parts, merged in the order of the header, and how to merge them. */
export interface UserDataParts {
  // Generated cloud-config (init, files); empty mapping when none.
  generated: Record<string, unknown>;
  from?: { spec: UserDataFrom; entries: ObjectEntry[]; field: string };
  inline?: { bytes: Uint8Array; field: string };
  script?: { text: string; field: string };
  mode: MergeMode;
  // The render's running budget (absent: unbounded, for tests of the merge alone).
  budget?: SeedBudget;
}

/** The final user-data bytes, and the field they are attributed to. */
export interface ComposedUserData {
  bytes: Uint8Array;
  // Where the bytes came from, for size errors and lint warnings.
  field: string;
  // Serialised here from the merged mapping: valid #cloud-config by
  // construction, so linting it would only parse it a second time.
  merged?: true;
}

const utf8 = (s: string) => new Uint8Array(Buffer.from(s, 'utf8'));

function cloudConfigOf(bytes: Uint8Array, field: string, maxExpanded: number | undefined): Record<string, unknown> {
  const { kind, payload } = detectUserDataKind(bytes);
  if (kind === 'empty') return {};
  if (kind !== '#cloud-config') {
    throw new VmseedError(
      'USERDATA_MERGE_UNSUPPORTED',
      `${field} is not #cloud-config (${kind === 'unknown' ? 'no recognised header' : `it is ${kind}`}), so it cannot be merged ` +
        'with the other user-data parts (init, files, userDataFrom, inline user-data); make it #cloud-config or use it alone',
      { kind: 'terminal', field },
    );
  }
  const parsed = parseYaml(Buffer.from(payload).toString('utf8'), {
    allowDuplicateKeys: true,
    field,
    ...(maxExpanded ? { maxExpandedBytes: maxExpanded } : {}),
  });
  if (!parsed.ok) {
    throw new VmseedError(
      'USERDATA_CLOUDCONFIG_INVALID',
      `${field}: #cloud-config is not valid YAML at ${where(parsed)} (${parsed.reason}); fix the YAML`,
      { kind: 'terminal', field },
    );
  }
  if (parsed.value === null) return {};
  if (!isPlainObject(parsed.value)) {
    throw new VmseedError('USERDATA_CLOUDCONFIG_INVALID', `${field}: #cloud-config must be a YAML mapping of modules`, {
      kind: 'terminal',
      field,
    });
  }
  return parsed.value;
}

function fromBytes(from: NonNullable<UserDataParts['from']>, budget: SeedBudget | undefined): Uint8Array {
  const bytes = from.entries[0].bytes;
  if (from.spec.encoding !== 'base64') {
    budget?.userData(bytes.length, from.field);
    return bytes;
  }
  budget?.userData(base64DecodedUpperBound(bytes.length), from.field);
  const r = decodeBase64Strict(Buffer.from(bytes).toString('latin1'));
  if (!r.ok) {
    throw new VmseedError(
      'USERDATA_BASE64_INVALID',
      `${from.field}: key "${from.entries[0].key}" is not valid base64 (${r.reason}); store it base64-encoded or set encoding: plain`,
      { kind: 'terminal', field: from.field },
    );
  }
  return r.bytes;
}

// Without a key, every key of the object is one top-level cloud-config key
// whose value is YAML (Virtlet's loadUserDataFromDataSource). Virtlet drops
// values that do not parse; here they are an error, so nothing vanishes.
function fromKeys(from: NonNullable<UserDataParts['from']>, budget: SeedBudget | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const e of from.entries) {
    budget?.userData(e.key.length + e.bytes.length, from.field);
    const parsed = parseYaml(Buffer.from(e.bytes).toString('utf8'), {
      allowDuplicateKeys: true,
      field: from.field,
      ...(budget ? { maxExpandedBytes: budget.maxUserDataBytes } : {}),
    });
    if (!parsed.ok) {
      throw new VmseedError(
        'USERDATA_CLOUDCONFIG_INVALID',
        `${from.field}: key "${e.key}" is not valid YAML at ${where(parsed)} (${parsed.reason}); every key becomes a cloud-config key, so its value must be YAML`,
        { kind: 'terminal', field: from.field },
      );
    }
    setKey(out, e.key, parsed.value);
  }
  return out;
}

/**
 * User-data from its parts (header), or undefined when there are none. Pure (a PURE_OPS step).
 * Throws terminal VmseedError: USERDATA_SOURCE_CONFLICT, USERDATA_MERGE_UNSUPPORTED,
 * USERDATA_CLOUDCONFIG_INVALID, USERDATA_BASE64_INVALID, USERDATA_TOO_LARGE, YAML_TOO_COMPLEX.
 */
export function composeUserData(parts: UserDataParts): ComposedUserData | undefined {
  const hasGenerated = Object.keys(parts.generated).length > 0;
  if (parts.script) {
    const others = [
      hasGenerated && 'init/files',
      parts.from && 'userDataFrom',
      parts.inline && parts.inline.field,
    ].filter(Boolean);
    if (others.length > 0) {
      throw new VmseedError(
        'USERDATA_SOURCE_CONFLICT',
        `${parts.script.field} replaces user-data wholesale, but ${others.join(', ')} also produce user-data that would be lost; ` +
          'remove userDataScript or the others',
        { kind: 'terminal', field: parts.script.field },
      );
    }
    return { bytes: utf8(parts.script.text), field: parts.script.field };
  }
  const budget = parts.budget;
  const documents: Array<{ bytes?: Uint8Array; map?: Record<string, unknown>; field: string }> = [];
  if (hasGenerated) documents.push({ map: parts.generated, field: 'init/files' });
  if (parts.from) {
    if (parts.from.spec.key !== undefined)
      documents.push({ bytes: fromBytes(parts.from, budget), field: parts.from.field });
    else documents.push({ map: fromKeys(parts.from, budget), field: parts.from.field });
  }
  if (parts.inline) {
    budget?.userData(parts.inline.bytes.length, parts.inline.field);
    documents.push({ bytes: parts.inline.bytes, field: parts.inline.field });
  }
  if (documents.length === 0) return undefined;
  if (documents.length === 1 && documents[0].bytes) return { bytes: documents[0].bytes, field: documents[0].field };
  const maxExpanded = budget?.maxUserDataBytes;
  let merged: Record<string, unknown> = {};
  for (const d of documents)
    merged = mergeCloudConfig(merged, d.map ?? cloudConfigOf(d.bytes!, d.field, maxExpanded), parts.mode);
  const last = documents[documents.length - 1];
  // Lists are concatenated and mappings merged, so the result is about the
  // parts' sum. Measured before it is serialised; the measure may count a
  // small-scalar document up to about twice its YAML size, so it is held to
  // twice the limit, and the serialised bytes to the limit itself (render).
  if (maxExpanded !== undefined && measureExpanded(merged, 2 * maxExpanded) === 'over') {
    throw new VmseedError(
      'USERDATA_TOO_LARGE',
      `the merged user-data (up to ${last.field}) is far more than the limit of ${maxExpanded} bytes; shrink the parts or raise --max-user-data-bytes`,
      { kind: 'terminal', field: last.field },
    );
  }
  return { bytes: utf8(`#cloud-config\n${dumpYaml(merged)}`), field: last.field, merged: true };
}
