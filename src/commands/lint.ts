// `vmseed lint`: a user-data, vendor-data or network-config file checked on
// the owner's own machine as the agent checks it, before any VM sees it: the
// agent's header and YAML lint (user-data-lint.ts), then cloud-init's own
// JSON schemas of one release (schema/check.ts), one line per problem like
// cloud-init's `schema` command. `vmseed build --lint` runs the same check
// over the documents of the seed it is about to write (lintDocument).
import { open } from 'node:fs/promises';
import { resolve } from 'node:path';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import type { Command, CliContext, ExitCode } from './cli.ts';
import { UsageError } from './cli.ts';
import { VmseedError } from '../errors.ts';
import { DEFAULT_MAX_NETWORK_DATA_BYTES, DEFAULT_MAX_USER_DATA_BYTES } from '../cloudinit/limits.ts';
import { lintUserData } from '../cloudinit/userdata/user-data-lint.ts';
import { isPlainObject, parseYaml, where } from '../cloudinit/yaml.ts';
import { checkSchemas, type SchemaDocument, type SchemaReport } from '../cloudinit/schema/check.ts';
import {
  CLOUD_INIT_RELEASES,
  DEFAULT_CLOUD_INIT_RELEASE,
  DEFAULT_SCHEMA_DIR,
  schemaStore,
} from '../cloudinit/schema/schema-store.ts';
import type { CiProfile } from '../cloudinit/schema/ci-validator.ts';

/** `vmseed lint --help`. */
export const LINT_USAGE = `usage: vmseed lint FILE [--type user-data|vendor-data|network-config]
                   [--cloud-init-version ${CLOUD_INIT_RELEASES.join('|')}] [--cloud-init-schemas DIR] [--json]

  Checks FILE ('-' for stdin) as the agent would: the user-data header and
  YAML, then cloud-init's own schemas of one release (default
  ${DEFAULT_CLOUD_INIT_RELEASE}, from --cloud-init-schemas, default ${DEFAULT_SCHEMA_DIR}).
  One line per problem ("FILE: error: PATH: MESSAGE (cloud-init R, MODULE)",
  "FILE: deprecation: ...", "FILE: not checked: ...") and a summary line.
  --type defaults to user-data. --json prints the findings as one JSON object.

  Exit 0: no errors (deprecations and parts not checked do not fail),
  2: errors (cloud-init would refuse or ignore part of the file) or bad usage,
  1: the schema files are missing (scripts/fetch-cloud-init-schemas.sh DIR).
`;

/** The schema options `lint` and `build --lint` share. */
export const SCHEMA_OPTIONS = {
  'cloud-init-version': { type: 'string' },
  'cloud-init-schemas': { type: 'string' },
} as const satisfies ParseArgsConfig['options'];

const LINT_OPTIONS = {
  ...SCHEMA_OPTIONS,
  type: { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const satisfies ParseArgsConfig['options'];

const DOCUMENTS: readonly SchemaDocument[] = ['user-data', 'vendor-data', 'network-config'];

/** The agent's bound on a document of this type (its --max-user-data-bytes / --max-network-data-bytes defaults). */
export function maxDocumentBytes(type: SchemaDocument): number {
  return type === 'network-config' ? DEFAULT_MAX_NETWORK_DATA_BYTES : DEFAULT_MAX_USER_DATA_BYTES;
}

/** Which schemas a check runs against; resolved (and found present) by `schemaTarget`. */
export interface SchemaTarget {
  dir: string;
  release: CiProfile;
  // The packaged cloud-init the schema files came from (release.json).
  version: string;
}

/** Thrown when the release's schema files are not in the directory: a failure of the host (exit 1), not of the input. */
export class SchemasMissingError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SchemasMissingError';
  }
}

/**
 * The release and directory --cloud-init-version / --cloud-init-schemas name.
 * Throws UsageError for an unknown release, SchemasMissingError when its files are absent.
 */
export function schemaTarget(values: { 'cloud-init-version'?: string; 'cloud-init-schemas'?: string }, cwd: string) {
  const release = (values['cloud-init-version'] ?? DEFAULT_CLOUD_INIT_RELEASE) as CiProfile;
  if (!CLOUD_INIT_RELEASES.includes(release)) {
    throw new UsageError(
      `--cloud-init-version: '${values['cloud-init-version']}' is not one of ${CLOUD_INIT_RELEASES.join(', ')}`,
    );
  }
  const dir =
    values['cloud-init-schemas'] === undefined ? DEFAULT_SCHEMA_DIR : resolve(cwd, values['cloud-init-schemas']);
  const status = schemaStore(dir)
    .status()
    .find((s) => s.release === release)!;
  if (status.state !== 'ready') {
    throw new SchemasMissingError(
      `cloud-init ${release}'s schema files are not in ${dir} (${status.reason.replace(/; run .*$/, '')}); ` +
        `fetch them with scripts/fetch-cloud-init-schemas.sh ${dir}, or name another directory with --cloud-init-schemas DIR`,
    );
  }
  return { dir, release, version: status.version } satisfies SchemaTarget;
}

/** One finding, as a line says it. */
export interface LintFinding {
  severity: 'error' | 'deprecation' | 'not checked';
  // cloud-init's dotted path ('' for the document), or the warning's code for a lint finding.
  path?: string;
  part?: string;
  message: string;
  module?: string;
  code?: string;
}

/** Everything the check of one document found. */
export interface LintResult {
  label: string;
  type: SchemaDocument;
  release: CiProfile;
  schemaVersion: string;
  findings: LintFinding[];
  // Schema problems past the report's bound, not listed.
  omitted: number;
  errors: number;
  deprecations: number;
  unchecked: number;
}

// The agent's lint: the findings that mean cloud-init ignores the document,
// or undefined when the schemas may look at it.
function agentLint(bytes: Uint8Array, type: SchemaDocument): LintFinding[] {
  const error = (code: string, message: string): LintFinding[] => [{ severity: 'error', code, message }];
  if (type !== 'network-config') {
    try {
      return lintUserData(bytes, type).map((w) => ({ severity: 'error', code: w.code, message: w.message }));
    } catch (e) {
      if (e instanceof VmseedError) return error(e.code, e.message);
      throw e;
    }
  }
  let parsed;
  try {
    parsed = parseYaml(new TextDecoder().decode(bytes), { yaml11: true, allowDuplicateKeys: true, field: type });
  } catch (e) {
    if (e instanceof VmseedError) return error(e.code, e.message);
    throw e;
  }
  if (!parsed.ok) {
    return error(
      'NETWORK_CONFIG_INVALID',
      `network-config is not valid YAML at ${where(parsed)} (${parsed.reason}); cloud-init would ignore it`,
    );
  }
  if (parsed.value !== null && !isPlainObject(parsed.value)) {
    return error('NETWORK_CONFIG_INVALID', 'network-config must be a YAML mapping ("network: {version: 2, ...}")');
  }
  return [];
}

/**
 * Checks one document against the agent's lint and `target`'s schemas (values
 * quoted: the owner's own file). Never throws on the document's content.
 */
export function lintDocument(label: string, type: SchemaDocument, bytes: Uint8Array, target: SchemaTarget): LintResult {
  const result: LintResult = {
    label,
    type,
    release: target.release,
    schemaVersion: target.version,
    findings: [],
    omitted: 0,
    errors: 0,
    deprecations: 0,
    unchecked: 0,
  };
  const max = maxDocumentBytes(type);
  if (bytes.length > max) {
    result.findings.push({
      severity: 'error',
      code: 'DOCUMENT_TOO_LARGE',
      message: `${bytes.length} bytes, more than the ${max} the agent takes as ${type}; it would refuse the seed`,
    });
  } else if (bytes.length > 0) {
    const lint = agentLint(bytes, type);
    result.findings.push(...lint);
    // A document cloud-init ignores has nothing more to check.
    if (lint.length === 0) {
      const key = type === 'user-data' ? 'userData' : type === 'vendor-data' ? 'vendorData' : 'networkConfig';
      addReport(result, checkSchemas({ dir: target.dir, release: target.release, reveal: true, [key]: bytes }));
    }
  }
  for (const f of result.findings) {
    if (f.severity === 'error') result.errors++;
    else if (f.severity === 'deprecation') result.deprecations++;
    else result.unchecked++;
  }
  return result;
}

function addReport(result: LintResult, report: SchemaReport): void {
  for (const p of report.problems) {
    result.findings.push({
      severity: p.severity,
      path: p.path,
      ...(p.part ? { part: p.part } : {}),
      message: p.message.trim(),
      module: p.module,
    });
  }
  for (const u of report.unchecked) {
    result.findings.push({ severity: 'not checked', ...(u.part ? { part: u.part } : {}), message: u.reason });
  }
  result.omitted = report.omitted;
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/** The lines of a result: one per finding, then the summary. */
export function lintLines(r: LintResult): string[] {
  const lines: string[] = [];
  for (const f of r.findings) {
    const part = f.part ? `${f.part}: ` : '';
    if (f.severity === 'not checked') {
      lines.push(`${r.label}: not checked: ${part}${f.message}`);
    } else if (f.code !== undefined) {
      lines.push(`${r.label}: ${f.severity}: ${part}${f.code}: ${f.message}`);
    } else {
      const path = f.path ? `${f.path}: ` : '';
      lines.push(`${r.label}: ${f.severity}: ${part}${path}${f.message} (cloud-init ${r.release}, ${f.module})`);
    }
  }
  const counts: string[] = [];
  if (r.errors > 0) counts.push(plural(r.errors, 'error'));
  if (r.deprecations > 0) counts.push(plural(r.deprecations, 'deprecation'));
  if (r.omitted > 0) counts.push(`${r.omitted} more not listed`);
  if (counts.length === 0) counts.push(r.unchecked > 0 ? 'no problems found' : 'valid');
  if (r.unchecked > 0) counts.push(`${r.unchecked} not checked`);
  lines.push(`${r.label}: ${counts.join(', ')} (cloud-init ${r.release} schema, Debian ${r.schemaVersion})`);
  return lines;
}

/** Whether a result should fail a pipeline: errors, or problems past the bound (which hold errors). */
export function lintFails(r: LintResult): boolean {
  return r.errors > 0 || r.omitted > 0;
}

// FILE read with the agent's bound: a larger file is refused before it is
// all read (stdin too).
async function readBounded(ctx: CliContext, file: string, max: number): Promise<Uint8Array> {
  const tooLarge = () =>
    new UsageError(
      `${file}: larger than ${max} bytes, the most the agent takes as one document (its ` +
        `--max-user-data-bytes default); split it, or gzip it as cloud-init accepts`,
    );
  if (file === '-') {
    const chunks: Buffer[] = [];
    let n = 0;
    for await (const c of ctx.stdin) {
      const b = Buffer.isBuffer(c) ? c : Buffer.from(c as string);
      n += b.length;
      if (n > max) throw tooLarge();
      chunks.push(b);
    }
    return new Uint8Array(Buffer.concat(chunks));
  }
  let fh;
  try {
    fh = await open(resolve(ctx.cwd, file), 'r');
  } catch (e) {
    throw new UsageError(`${file}: cannot read it (${(e as { code?: string }).code ?? 'error'})`);
  }
  try {
    const st = await fh.stat();
    if (st.isDirectory()) throw new UsageError(`${file}: is a directory`);
    if (st.isFile() && st.size > max) throw tooLarge();
    const buf = Buffer.alloc(max + 1);
    let off = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, off, buf.length - off, null);
      if (bytesRead === 0) break;
      off += bytesRead;
      if (off > max) throw tooLarge();
    }
    return new Uint8Array(buf.subarray(0, off));
  } catch (e) {
    if (e instanceof UsageError) throw e;
    throw new UsageError(`${file}: cannot read it (${(e as { code?: string }).code ?? 'error'})`);
  } finally {
    await fh.close();
  }
}

/**
 * `vmseed lint FILE`: exit 0 when cloud-init would take the file as it is, 2
 * when it has errors (or on bad usage), 1 when the schema files are missing.
 */
export const lint: Command = async (ctx): Promise<ExitCode> => {
  try {
    let parsed;
    try {
      parsed = parseArgs({ args: ctx.argv, options: LINT_OPTIONS, strict: true, allowPositionals: true });
    } catch (e) {
      throw new UsageError((e as Error).message);
    }
    const { values, positionals } = parsed;
    if (values.help) {
      ctx.stdout.write(LINT_USAGE);
      return 0;
    }
    if (positionals.length !== 1) throw new UsageError('give exactly one FILE (- for stdin)');
    const type = (values.type ?? 'user-data') as SchemaDocument;
    if (!DOCUMENTS.includes(type))
      throw new UsageError(`--type: '${values.type}' is not one of ${DOCUMENTS.join(', ')}`);
    const target = schemaTarget(values, ctx.cwd);
    const file = positionals[0];
    const bytes = await readBounded(ctx, file, maxDocumentBytes(type));
    const result = lintDocument(file === '-' ? '<stdin>' : file, type, bytes, target);
    if (values.json) ctx.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    else ctx.stdout.write(lintLines(result).join('\n') + '\n');
    return lintFails(result) ? 2 : 0;
  } catch (e) {
    if (e instanceof UsageError) {
      ctx.stderr.write(`vmseed lint: ${e.message}\n`);
      return 2;
    }
    if (e instanceof SchemasMissingError) {
      ctx.stderr.write(`vmseed lint: ${e.message}\n`);
      return 1;
    }
    ctx.stderr.write(`vmseed lint: ${(e as Error)?.message ?? String(e)}\n`);
    return 1;
  }
};

export default lint;
