// A seed's documents checked against cloud-init's schemas before the guest
// sees them: user-data and vendor-data (each #cloud-config document, or each
// text/cloud-config part of a MIME message) against the release's
// cloud-config schema, NoCloud network-config v1/v2 against its network
// schemas. What cannot be checked is said, with why: a jinja template is
// rendered in the guest, an #include's targets are fetched by the guest.
// Never throws on a document: a check only ever adds warnings.
import { detectUserDataKind } from '../userdata/user-data-lint.ts';
import { isPlainObject, parseYaml, where } from '../yaml.ts';
import { SchemaWalkBudgetError, type CiProfile } from './ci-validator.ts';
import { walkMime } from './mime-parts.ts';
import { toProblems, type SchemaProblem } from './problems.ts';
import { schemaStore, type SchemaFile } from './schema-store.ts';

/** A seed document that is checked. */
export type SchemaDocument = 'user-data' | 'vendor-data' | 'network-config';

/** What to check, against which release. Structured-clonable (it crosses to a render worker). */
export interface SchemaCheckRequest {
  dir: string;
  release: CiProfile;
  // Whether messages may quote the document's values (see problems.ts).
  reveal: boolean;
  userData?: Uint8Array;
  vendorData?: Uint8Array;
  // NoCloud network-config YAML; ConfigDrive's network_data.json is OpenStack's format.
  networkConfig?: Uint8Array;
}

/** A problem, with the document and the MIME part it is in. */
export interface LocatedProblem extends SchemaProblem {
  document: SchemaDocument;
  part?: string;
}

/** A document or part that was not checked, and why. */
export interface UncheckedPart {
  // SCHEMA_TEMPLATE: a jinja template, rendered in the guest. Normal
  // (Cluster API's bootstrap data is one), so only `vmseed lint` says it.
  code: 'SCHEMA_UNCHECKED' | 'SCHEMA_TEMPLATE' | 'SCHEMA_BUDGET_EXCEEDED';
  document: SchemaDocument;
  part?: string;
  reason: string;
}

/** Everything one check found; `omitted` counts problems past MAX_PROBLEMS. */
export interface SchemaReport {
  release: CiProfile;
  problems: LocatedProblem[];
  omitted: number;
  unchecked: UncheckedPart[];
}

/** Problems kept per report: enough to fix a document, bounded for Events and the status page. */
export const MAX_PROBLEMS = 50;
/**
 * YAML nodes (keys and values) a document may have to be checked: a cloud-config of hundreds of
 * files and commands has a few thousand. Counted before any object is built; each node can
 * cost an error object, so this also bounds the walk's memory.
 */
export const MAX_SCHEMA_NODES = 50_000;
/** anyOf/oneOf branches one document's walk may run. */
export const MAX_SCHEMA_BRANCHES = 50_000;

// !!binary (bytes, which cloud-init's string type accepts) as a string of
// the same length, in place: the parsed document is this check's own.
// Aliases make a DAG, not a tree: each collection is visited once.
function normalise(v: unknown, seen = new Set<object>()): unknown {
  if (v instanceof Uint8Array) return Buffer.from(v).toString('latin1');
  if (typeof v !== 'object' || v === null || v instanceof Date || seen.has(v)) return v;
  seen.add(v);
  if (Array.isArray(v)) for (let i = 0; i < v.length; i++) v[i] = normalise(v[i], seen);
  else
    for (const [k, x] of Object.entries(v))
      if (x instanceof Uint8Array || (typeof x === 'object' && x !== null))
        Object.defineProperty(v, k, {
          value: normalise(x, seen),
          enumerable: true,
          writable: true,
          configurable: true,
        });
  return v;
}

class Collector {
  readonly report: SchemaReport;
  constructor(release: CiProfile) {
    this.report = { release, problems: [], omitted: 0, unchecked: [] };
  }
  problems(ps: SchemaProblem[], document: SchemaDocument, part?: string): void {
    for (const p of ps) {
      if (this.report.problems.length >= MAX_PROBLEMS) this.report.omitted++;
      else this.report.problems.push({ ...p, document, ...(part ? { part } : {}) });
    }
  }
  unchecked(u: UncheckedPart): void {
    this.report.unchecked.push(u);
  }
}

function validateData(
  req: SchemaCheckRequest,
  c: Collector,
  file: SchemaFile,
  data: unknown,
  document: SchemaDocument,
  part: string | undefined,
): void {
  const at = { document, ...(part ? { part } : {}) };
  const normal = normalise(data);
  const store = schemaStore(req.dir);
  const found = store.validator(req.release, file);
  if (!found.ok) {
    c.unchecked({ code: 'SCHEMA_UNCHECKED', ...at, reason: `cloud-init ${req.release} schema: ${found.reason}` });
    return;
  }
  try {
    const { errors, deprecations } = found.validator.validate(normal, MAX_SCHEMA_BRANCHES);
    if (file === 'cloud-config') store.warmed(req.release);
    c.problems(
      toProblems(errors, deprecations, {
        reveal: req.reveal,
        modules: found.validator.modules,
        profile: req.release,
        ...(file === 'cloud-config' ? {} : { fallbackModule: 'network-config' }),
      }),
      document,
      part,
    );
  } catch (e) {
    if (!(e instanceof SchemaWalkBudgetError)) throw e;
    c.unchecked({
      code: 'SCHEMA_BUDGET_EXCEEDED',
      ...at,
      reason: `checking it runs more than ${MAX_SCHEMA_BRANCHES} alternatives of the schema; simplify it`,
    });
  }
}

function cloudConfig(req: SchemaCheckRequest, c: Collector, text: string, document: SchemaDocument, part?: string) {
  let parsed;
  try {
    parsed = parseYaml(text, { yaml11: true, allowDuplicateKeys: true, field: document, maxNodes: MAX_SCHEMA_NODES });
  } catch (e) {
    c.unchecked({
      code: 'SCHEMA_BUDGET_EXCEEDED',
      document,
      ...(part ? { part } : {}),
      reason: e instanceof Error ? e.message : String(e),
    });
    return;
  }
  if (!parsed.ok) {
    c.unchecked({
      code: 'SCHEMA_UNCHECKED',
      document,
      ...(part ? { part } : {}),
      reason: `not valid YAML at ${where(parsed)}`,
    });
    return;
  }
  // Empty, or not a mapping: cloud-init refuses it before its schema (user-data-lint.ts says so).
  if (!isPlainObject(parsed.value)) return;
  validateData(req, c, 'cloud-config', parsed.value, document, part);
}

function uncheckedCode(kind: string): UncheckedPart['code'] {
  return kind === '## template: jinja' ? 'SCHEMA_TEMPLATE' : 'SCHEMA_UNCHECKED';
}

// Why a kind of user-data is not checked; undefined: nothing to check.
function notChecked(kind: string): string | undefined {
  switch (kind) {
    case '## template: jinja':
      return 'a jinja template is rendered in the guest with its instance data; vmseed does not render it';
    case '#include':
    case '#include-once':
      return 'the guest fetches the URLs an #include names; their content is not checked';
    case '#cloud-config-archive':
    case '#cloud-config-jsonp':
      return `${kind} is not checked`;
    case '#part-handler':
      return 'a part handler is Python code; nothing to check';
    default:
      return undefined;
  }
}

const PART_KINDS: Record<string, string> = {
  'text/cloud-config': '#cloud-config',
  'text/jinja2': '## template: jinja',
  'text/x-include-url': '#include',
  'text/x-include-once-url': '#include-once',
  'text/cloud-config-archive': '#cloud-config-archive',
  'text/cloud-config-jsonp': '#cloud-config-jsonp',
  'text/part-handler': '#part-handler',
};

function userDataLike(req: SchemaCheckRequest, c: Collector, bytes: Uint8Array, document: SchemaDocument) {
  const { kind, payload } = detectUserDataKind(bytes);
  if (kind === '#cloud-config') {
    cloudConfig(req, c, new TextDecoder().decode(payload), document);
    return;
  }
  if (kind !== 'mime') {
    const reason = notChecked(kind);
    if (reason) c.unchecked({ code: uncheckedCode(kind), document, reason });
    return;
  }
  const walk = walkMime(Buffer.from(payload).toString('utf8'));
  if (walk.error) c.unchecked({ code: 'SCHEMA_UNCHECKED', document, reason: `MIME message: ${walk.error}` });
  walk.parts.forEach((p, i) => {
    const part = `part ${i + 1}${p.filename ? ` (${p.filename})` : ''}`;
    // text/plain and text/x-not-multipart parts are typed by their first line, as a whole document is.
    const kind =
      PART_KINDS[p.type] ??
      (p.type === 'text/plain' || p.type === 'text/x-not-multipart' ? detectUserDataKind(p.body).kind : p.type);
    if (kind === '#cloud-config') cloudConfig(req, c, new TextDecoder().decode(p.body), document, part);
    else {
      const reason = notChecked(kind);
      if (reason) c.unchecked({ code: uncheckedCode(kind), document, part, reason });
    }
  });
  if (walk.more > 0)
    c.unchecked({
      code: 'SCHEMA_BUDGET_EXCEEDED',
      document,
      reason: `${walk.more} MIME parts past the first ${walk.parts.length} are not checked`,
    });
}

function networkConfig(req: SchemaCheckRequest, c: Collector, bytes: Uint8Array) {
  const document = 'network-config';
  let parsed;
  try {
    parsed = parseYaml(new TextDecoder().decode(bytes), {
      yaml11: true,
      allowDuplicateKeys: true,
      field: document,
      maxNodes: MAX_SCHEMA_NODES,
    });
  } catch (e) {
    c.unchecked({ code: 'SCHEMA_BUDGET_EXCEEDED', document, reason: e instanceof Error ? e.message : String(e) });
    return;
  }
  if (!parsed.ok || !isPlainObject(parsed.value)) return;
  const cfg = parsed.value;
  const inner = isPlainObject(cfg.network) ? cfg.network : cfg;
  const version = inner.version;
  if (version !== 1 && version !== 2) {
    c.unchecked({ code: 'SCHEMA_UNCHECKED', document, reason: 'network-config has no version 1 or 2' });
    return;
  }
  if (req.release === '22.4') {
    c.unchecked({ code: 'SCHEMA_UNCHECKED', document, reason: 'cloud-init 22.4 ships no network-config schema' });
    return;
  }
  validateData(req, c, version === 1 ? 'network-config-v1' : 'network-config-v2', cfg, document, undefined);
}

/** Checks the request's documents; pure apart from reading the schema files once per process. */
export function checkSchemas(req: SchemaCheckRequest): SchemaReport {
  const c = new Collector(req.release);
  if (req.userData && req.userData.length > 0) userDataLike(req, c, req.userData, 'user-data');
  if (req.vendorData && req.vendorData.length > 0) userDataLike(req, c, req.vendorData, 'vendor-data');
  if (req.networkConfig && req.networkConfig.length > 0) networkConfig(req, c, req.networkConfig);
  return c.report;
}

// The modules most seeds use, one document each: a warm-up step compiles
// one module's schema, so no step holds the thread for long.
const WARM_UP = [
  // First alone: loading ajv and compiling the root schema.
  'hostname: h',
  'users: [default, {name: u, sudo: "ALL=(ALL) NOPASSWD:ALL", groups: [wheel], shell: /bin/bash, ssh_authorized_keys: [k], lock_passwd: false}]',
  'ssh_authorized_keys: [k]\nssh_pwauth: false',
  'chpasswd: {expire: false, users: [{name: u, password: p, type: text}]}',
  'write_files: [{path: /f, content: c, permissions: "0644", owner: "root:root", encoding: b64, append: false, defer: false}]',
  'packages: [p]\npackage_update: true',
  'runcmd: [[ls, -l], ls]\nbootcmd: [ls]',
  'ntp: {enabled: true, servers: [s]}',
  'apt: {sources: {s: {source: s}}}',
  'timezone: UTC',
  'mounts: [[a, b]]\npower_state: {mode: reboot}',
];

/**
 * A release's warm-up as steps, each one short check: run them all and the checks after them
 * compile little (schema-store.ts isWarm is true after the first).
 */
export function warmUpSteps(dir: string, release: CiProfile): (() => void)[] {
  return WARM_UP.map((doc) => () => {
    checkSchemas({ dir, release, reveal: false, userData: new TextEncoder().encode(`#cloud-config\n${doc}\n`) });
  });
}
