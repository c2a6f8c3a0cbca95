// Whether a seed's user-data is Cluster API bootstrap data whose runcmd
// writes the sentinel /run/cluster-api/bootstrap-success.complete as its
// last command. Controllers such as Cluster API Provider KubeVirt check that
// file over SSH to learn that kubeadm finished; vmseed can answer from
// cloud-init's own reports instead, but only when the sentinel is last.
//
// Why last: cloud-init writes runcmd as one /bin/sh script (no `set -e`),
// which scripts_user runs; its exit status is its last command's. CABPK
// ends runcmd with `kubeadm … && echo success > <sentinel>`, which exits
// non-zero exactly when the sentinel was not written, so scripts_user and
// modules-final finish FAIL exactly then: a boot that finished without FAIL
// proves the file was written. Commands after it (postKubeadmCommands), a
// shell-script part or any other place break that link: 'elsewhere'.
//
// Pure and bounded (a PURE_OPS step): user-data without the path is answered
// from one byte search; nothing past `maxBytes` is decompressed or parsed;
// anything that cannot be read is 'elsewhere' when the path occurs, never a
// throw.
import { gunzipSync } from 'node:zlib';
import { walkMime } from '../schema/mime-parts.ts';
import { isPlainObject, parseYaml } from '../yaml.ts';
import { detectUserDataKind } from './user-data-lint.ts';

export const BOOTSTRAP_SENTINEL_PATH = '/run/cluster-api/bootstrap-success.complete';

/** Where the user-data writes the Cluster API sentinel, if anywhere. */
export type BootstrapSentinel = 'last' | 'elsewhere' | 'none';

const PATH_BYTES = Buffer.from(BOOTSTRAP_SENTINEL_PATH);
// The last command of a script, after `&&`, `;`, a newline or at its start:
// `echo success > <sentinel>` (CABPK's sentinelFileCommand), optionally `;`.
// After `||` or inside `if … fi` the write does not follow from success.
const LAST_COMMAND = new RegExp(
  String.raw`(?:^|&&|;|\n)\s*echo\s+success\s*>>?\s*` +
    BOOTSTRAP_SENTINEL_PATH.replace(/[.]/g, '\\.') +
    String.raw`\s*;?\s*$`,
);
const SHELLS = new Set(['sh', 'bash', 'dash', '/bin/sh', '/bin/bash', '/bin/dash', '/usr/bin/bash', '/usr/bin/sh']);

function hasPath(b: Uint8Array): boolean {
  return Buffer.from(b.buffer, b.byteOffset, b.byteLength).indexOf(PATH_BYTES) >= 0;
}

function isGzip(b: Uint8Array): boolean {
  return b.length >= 2 && b[0] === 0x1f && b[1] === 0x8b;
}

function isMime(b: Uint8Array): boolean {
  return Buffer.from(b.subarray(0, 4096)).toString('latin1').toLowerCase().includes('mime-version:');
}

/**
 * Where `userData` (the seed's bytes) writes the Cluster API sentinel: 'last' when its cloud-config
 * runcmd ends with the write, 'elsewhere' when the path occurs otherwise (or cannot be read),
 * 'none' when it does not occur. `maxBytes`: the render's user-data limit, the most decompressed
 * or parsed. Pure (a PURE_OPS step); never throws.
 */
export function bootstrapSentinel(userData: Uint8Array, maxBytes: number): BootstrapSentinel {
  try {
    return classify(userData, maxBytes);
  } catch {
    return hasPath(userData) ? 'elsewhere' : 'none';
  }
}

/**
 * 'none' when the answer needs no parse (no gzip, no MIME, no path: one byte search), else
 * undefined; lets a render keep the common case off its worker threads.
 */
export function quickBootstrapSentinel(userData: Uint8Array): 'none' | undefined {
  return isGzip(userData) || isMime(userData) || hasPath(userData) ? undefined : 'none';
}

function classify(userData: Uint8Array, maxBytes: number): BootstrapSentinel {
  let payload = userData;
  if (isGzip(payload)) {
    try {
      payload = new Uint8Array(gunzipSync(payload, { maxOutputLength: maxBytes }));
    } catch {
      // Over the limit once decompressed, or not gzip after all: not read.
      return 'none';
    }
  }
  if (payload.length > maxBytes) return hasPath(payload) ? 'elsewhere' : 'none';
  const mime = isMime(payload);
  // The fast path: most user-data never mentions the path. A MIME part
  // may hide it in base64, so a message is walked.
  if (!mime && !hasPath(payload)) return 'none';
  if (!mime) return documentRuncmd(payload) ?? 'elsewhere';
  const walk = walkMime(Buffer.from(payload).toString('utf8'));
  if (walk.error || walk.more > 0)
    return hasPath(payload) || walk.parts.some((p) => hasPath(p.body)) ? 'elsewhere' : 'none';
  if (!walk.parts.some((p) => hasPath(p.body))) return 'none';
  // cloud-init merges the cloud-config parts; with the default merger a
  // later part's runcmd replaces an earlier one. Anything else (a merge
  // directive, a list appended) is not followed.
  const configs = walk.parts.filter(
    (p) =>
      p.type === 'text/cloud-config' ||
      p.type === 'text/jinja2' ||
      ((p.type === 'text/plain' || p.type === 'text/x-not-multipart') &&
        ['#cloud-config', '## template: jinja'].includes(detectUserDataKind(p.body).kind)),
  );
  let last: BootstrapSentinel | undefined;
  for (const p of configs) {
    const doc = cloudConfig(p.body, p.type === 'text/cloud-config' ? 'plain' : 'header');
    if (doc === undefined) return 'elsewhere';
    if ('merge_how' in doc || 'merge_type' in doc) return 'elsewhere';
    if ('runcmd' in doc) last = runcmdVerdict(doc.runcmd);
  }
  return last === 'last' ? 'last' : 'elsewhere';
}

// A whole document (not MIME): '#cloud-config' or a Jinja template of one.
function documentRuncmd(payload: Uint8Array): BootstrapSentinel | undefined {
  const doc = cloudConfig(payload, 'header');
  if (doc === undefined) return undefined;
  return 'runcmd' in doc ? runcmdVerdict(doc.runcmd) : 'elsewhere';
}

// The document's top mapping, or undefined when it is not a cloud-config
// vmseed can read as cloud-init will: a Jinja template with statements
// (`{%`) could render any runcmd, so only one without them is read.
function cloudConfig(bytes: Uint8Array, framing: 'plain' | 'header'): Record<string, unknown> | undefined {
  let text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  if (framing === 'header') {
    const kind = detectUserDataKind(bytes).kind;
    if (kind === '## template: jinja') {
      if (text.includes('{%')) return undefined;
      text = text.slice(text.indexOf('\n') + 1);
      if (!text.trimStart().toLowerCase().startsWith('#cloud-config')) return undefined;
    } else if (kind !== '#cloud-config') return undefined;
  } else if (text.includes('{%')) return undefined;
  let parsed;
  try {
    parsed = parseYaml(text, { yaml11: true, allowDuplicateKeys: true, field: 'user-data' });
  } catch {
    // Past the parser's alias, depth or size bounds.
    return undefined;
  }
  if (!parsed.ok) return undefined;
  if (parsed.value === null) return {};
  return isPlainObject(parsed.value) ? parsed.value : undefined;
}

// runcmd: each entry a string (a line of the script) or a list (argv,
// which cloud-init quotes word by word, so a redirect works only inside a
// shell's `-c` script).
function runcmdVerdict(runcmd: unknown): BootstrapSentinel {
  if (!Array.isArray(runcmd) || runcmd.length === 0) return 'elsewhere';
  const last: unknown = runcmd.at(-1);
  if (typeof last === 'string') return LAST_COMMAND.test(last.trimEnd()) ? 'last' : 'elsewhere';
  if (Array.isArray(last) && last.length >= 3) {
    const argv: unknown[] = last;
    const [shell, flag, script] = [argv[0], argv.at(-2), argv.at(-1)];
    if (
      typeof shell === 'string' &&
      SHELLS.has(shell) &&
      flag === '-c' &&
      typeof script === 'string' &&
      LAST_COMMAND.test(script.trimEnd())
    )
      return 'last';
  }
  return 'elsewhere';
}
