// "cloud-init did nothing" is the most common support question (KubeVirt
// #8856, #8503): user-data without a header cloud-init recognises is stored
// as text/x-not-multipart and ignored. This reproduces cloud-init's own
// detection (user_data.py convert_string, handlers type_from_starts_with):
// gunzip if gzip, MIME if "mime-version:" is in the first 4096 bytes, else
// the lower-cased, left-stripped text must start with a known prefix.
import { gunzipSync } from 'node:zlib';
import { VmseedError } from '../../errors.ts';
import type { SeedWarning } from '../seed.ts';
import { checkYaml, isPlainObject, parseYaml, where } from '../yaml.ts';

// handlers/__init__.py INCLUSION_TYPES_MAP; searched longest first.
export const USERDATA_HEADERS: readonly string[] = [
  '#cloud-config-archive',
  '#cloud-config-jsonp',
  '## template: jinja',
  '#cloud-boothook',
  '#cloud-config',
  '#include-once',
  '#part-handler',
  '#include',
  '#!',
];

// First lines cloudbase-init (Windows guests, usually on ConfigDrive) acts on
// though cloud-init does not (cloudbase-init doc/source/userdata.rst). Such
// user-data is meant for Windows, so a "cloud-init will ignore it" warning
// would be noise.
export const CLOUDBASE_INIT_HEADERS: readonly string[] = [
  '#ps1',
  'rem cmd',
  '-----begin certificate-----',
  '<script>',
  '<powershell>',
];

// The kinds callers compare against by name; any other is a header from USERDATA_HEADERS.
export type UserDataKind = 'empty' | 'mime' | 'unknown' | 'cloudbase-init' | string;

// Python's str.lstrip() (what cloud-init calls): unlike JS trimStart it keeps
// U+FEFF and strips \x1c-\x1f and \x85.
const PY_LEADING_SPACE = /^[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/;

function isGzip(b: Uint8Array): boolean {
  return b.length >= 2 && b[0] === 0x1f && b[1] === 0x8b;
}

/**
 * The header cloud-init will dispatch on ('#cloud-config', 'mime', ...), 'empty', 'cloudbase-init'
 * (cloud-init ignores it, cloudbase-init runs it), or 'unknown' (nothing will run it); with the
 * payload, gunzipped when it was gzip.
 */
export function detectUserDataKind(data: Uint8Array): { kind: UserDataKind; payload: Uint8Array } {
  let payload = data;
  if (isGzip(payload)) {
    try {
      payload = new Uint8Array(gunzipSync(payload));
    } catch {
      // cloud-init keeps the raw bytes when gunzip fails; they match no header.
      return { kind: 'unknown', payload: data };
    }
  }
  if (payload.length === 0) return { kind: 'empty', payload };
  const head = Buffer.from(payload.subarray(0, 4096)).toString('latin1').toLowerCase();
  if (head.includes('mime-version:')) return { kind: 'mime', payload };
  let text: string;
  try {
    // Keep a BOM: cloud-init does not strip it, so "\ufeff#cloud-config" matches no header.
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(payload);
  } catch {
    return { kind: 'unknown', payload };
  }
  const lc = text.toLowerCase().replace(PY_LEADING_SPACE, '');
  if (lc === '') return { kind: 'empty', payload };
  for (const h of USERDATA_HEADERS) if (lc.startsWith(h)) return { kind: h, payload };
  if (CLOUDBASE_INIT_HEADERS.some((h) => lc.startsWith(h))) return { kind: 'cloudbase-init', payload };
  return { kind: 'unknown', payload };
}

/**
 * Lints user-data: a USERDATA_NO_HEADER warning when cloud-init will ignore it; a terminal
 * USERDATA_CLOUDCONFIG_INVALID (or YAML_TOO_COMPLEX) thrown when a #cloud-config part cannot be
 * loaded (cloud-init would log and skip it). Pure (a PURE_OPS step).
 */
export function lintUserData(data: Uint8Array, field: string): SeedWarning[] {
  const { kind, payload } = detectUserDataKind(data);
  if (kind === 'unknown') {
    return [
      {
        code: 'USERDATA_NO_HEADER',
        field,
        message:
          'user-data does not start with a header cloud-init recognises (#cloud-config, #!, #include, #cloud-boothook, ' +
          '#part-handler, ## template: jinja, a MIME multipart message or gzip); cloud-init will store it as ' +
          'text/x-not-multipart and do nothing with it. Add "#cloud-config" as the first line for cloud-config YAML, ' +
          'or "#!/bin/sh" for a script',
      },
    ];
  }
  if (kind === '#cloud-config') {
    const text = new TextDecoder().decode(payload);
    // Checked without building the objects; built only to describe a
    // document that is not a mapping.
    const checked = checkYaml(text, { field });
    const parsed = !checked.ok
      ? checked
      : checked.value.top === 'mapping' || checked.value.top === 'empty'
        ? { ok: true as const, value: null }
        : parseYaml(text, { allowDuplicateKeys: true, field });
    if (!parsed.ok) {
      throw new VmseedError(
        'USERDATA_CLOUDCONFIG_INVALID',
        `${field}: #cloud-config is not valid YAML at ${where(parsed)} (${parsed.reason}); cloud-init would ignore ` +
          'all of it. Fix the YAML (indentation with spaces, quotes around values containing ": ")',
        { kind: 'terminal', field },
      );
    }
    if (parsed.value !== null && !isPlainObject(parsed.value)) {
      const got = Array.isArray(parsed.value) ? 'a list' : `a ${typeof parsed.value}`;
      const lines = text.split('\n');
      const first = lines.findIndex((l) => l.trim() !== '' && !l.trimStart().startsWith('#'));
      throw new VmseedError(
        'USERDATA_CLOUDCONFIG_INVALID',
        `${field}: #cloud-config must be a YAML mapping of modules (e.g. "runcmd: [...]") but the document at line ` +
          `${first + 1}, column 1 is ${got}; ` +
          'cloud-init would ignore it',
        { kind: 'terminal', field },
      );
    }
  }
  return [];
}
