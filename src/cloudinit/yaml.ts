// One place that parses YAML for src/cloudinit, so every caller reports errors
// the same way: 1-based line and column plus the parser's reason, never the
// source snippet (it would quote user-data or Secret content into Events).
//
// Every parse is bounded: js-yaml's maxDepth stops a deep nest
// while parsing; then, on the parser's event stream and before any object is
// built, aliases are counted (at most LIMITS.yamlAliases) and the document's
// size with every alias expanded (what JSON.stringify, dump or a merge would
// walk) is computed in one pass from the sizes of the anchored nodes, so an
// alias bomb costs its own length, not its expansion. Only then are the
// objects constructed from the same events. A recursive alias is refused.
//
// js-yaml, not the `yaml` package (2.9.1): `yaml` takes several times the
// CPU to parse typical cloud-config and 1 MiB of one-line keys, and refuses
// the alias bombs of test/hostile only after many times the work of the
// measure above (docs/threat-model.md, "Measured"); its error messages quote
// the source line; and its stringify quotes differently ("0644" for '0644'),
// so every merged seed's bytes would change.
import {
  constructFromEvents,
  dump,
  EVENT_DOCUMENT,
  EVENT_POP,
  parseEvents,
  YAML11_SCHEMA,
  YAMLException,
  type Event,
} from 'js-yaml';
import { VmseedError } from '../errors.ts';
import { LIMITS } from './limits.ts';
import { measureEvents, type EventMeasure } from './yaml-measure.ts';

export { measureExpanded } from './yaml-measure.ts';

export type YamlResult<T> = { ok: true; value: T } | { ok: false; line?: number; column?: number; reason: string };

export interface YamlOptions {
  // PyYAML (cloud-init) lets a later duplicate key win; js-yaml rejects it unless asked.
  allowDuplicateKeys?: boolean;
  // The input field, for YAML_TOO_COMPLEX.
  field?: string;
  // Read scalars as PyYAML (YAML 1.1) does: yes/on are booleans, 0644 is
  // octal, a date is a date. For checking values as cloud-init will see them;
  // a document vmseed rewrites keeps the default (core) reading.
  yaml11?: boolean;
  // Bound on the parsed value's expanded size (default
  // LIMITS.yamlExpandedBytes), never below 4 × the text's own length: a
  // document without aliases measures a small multiple of its text.
  maxExpandedBytes?: number;
  // Bound on the document's nodes (keys, values, aliases), for a caller
  // whose work grows with them; YAML_TOO_COMPLEX before objects are built.
  maxNodes?: number;
}

// Parse to events and measure them; throws YAML_TOO_COMPLEX, or a
// YAMLException for a syntax error.
function parseMeasured(text: string, options: YamlOptions): { events: Event[]; m: EventMeasure } {
  const events = parseEvents(text, { maxDepth: LIMITS.yamlDepth });
  const limit = Math.max(options.maxExpandedBytes ?? LIMITS.yamlExpandedBytes, 4 * text.length);
  if (options.maxNodes !== undefined) {
    let nodes = 0;
    for (const e of events) if (e.type !== EVENT_POP && e.type !== EVENT_DOCUMENT) nodes++;
    if (nodes > options.maxNodes)
      throw tooComplex(
        options.field,
        `more than ${options.maxNodes} YAML nodes (keys and values)`,
        'split it into several documents or MIME parts',
      );
  }
  const m = measureEvents(events, text, limit);
  if (m.verdict === 'aliases') throw tooComplex(options.field, `more than ${LIMITS.yamlAliases} aliases (*name)`);
  if (m.verdict === 'cycle') throw tooComplex(options.field, 'a recursive alias makes the document contain itself');
  if (m.verdict === 'over')
    throw tooComplex(options.field, `with its aliases expanded the document is more than ${limit} bytes`);
  return { events, m };
}

function tooComplex(
  field: string | undefined,
  what: string,
  fix = 'write the data out instead of using anchors and aliases, or nest less',
): VmseedError {
  return new VmseedError('YAML_TOO_COMPLEX', `${field ?? 'YAML'}: ${what}; ${fix}`, {
    kind: 'terminal',
    ...(field ? { field } : {}),
  });
}

// js-yaml's limit errors become YAML_TOO_COMPLEX, not a syntax error.
function limitFailure(e: unknown, field: string | undefined): void {
  if (!(e instanceof YAMLException)) return;
  if (e.reason.startsWith('aliases exceeded maxAliases'))
    throw tooComplex(field, `more than ${LIMITS.yamlAliases} aliases (*name)`);
  if (e.reason.startsWith('nesting exceeded maxDepth'))
    throw tooComplex(field, `nested more than ${LIMITS.yamlDepth} levels deep`);
}

// Some js-yaml reasons quote the input (tag names, alias names); keep only
// the fixed part so no user data reaches an Event.
function safeReason(reason: string): string {
  return reason.replace(/\s*(?:!<|"|'|:\s).*$/s, '').slice(0, 120) || 'syntax error';
}

function failure(e: unknown): { ok: false; line?: number; column?: number; reason: string } {
  if (e instanceof YAMLException) {
    const m = e.mark;
    const reason = safeReason(e.reason);
    return m ? { ok: false, line: m.line + 1, column: m.column + 1, reason } : { ok: false, reason };
  }
  throw e;
}

function construct(text: string, events: Event[], options: YamlOptions): unknown[] {
  return constructFromEvents(events, {
    source: text,
    json: options.allowDuplicateKeys === true,
    maxAliases: LIMITS.yamlAliases,
    ...(options.yaml11 ? { schema: YAML11_SCHEMA } : {}),
  });
}

/**
 * Parses one YAML document, bounded (header). Bad YAML is `ok: false` with a 1-based line and
 * column, never a throw; an empty document is null. Throws terminal YAML_TOO_COMPLEX past the
 * alias, depth or expanded-size bound.
 */
export function parseYaml(text: string, options: YamlOptions = {}): YamlResult<unknown> {
  try {
    const { events } = parseMeasured(text, options);
    // An empty or comment-only document is null in PyYAML; js-yaml's load throws.
    const docs = construct(text, events, options);
    if (docs.length > 1) return { ok: false, reason: 'expected a single YAML document but found several ("---")' };
    return { ok: true, value: docs.length === 0 ? null : docs[0] };
  } catch (e) {
    limitFailure(e, options.field);
    return failure(e);
  }
}

/**
 * What a linter needs without building the objects (on a large document, building them costs a
 * multiple of parsing: docs/threat-model.md, "Measured"): is it one valid document, and what is
 * its top node. Constructed anyway when only construction could find the error (explicit tags, an
 * unknown alias); duplicate keys are allowed, as PyYAML allows them. Throws as parseYaml does.
 */
export function checkYaml(
  text: string,
  options: Omit<YamlOptions, 'allowDuplicateKeys'> = {},
): YamlResult<{ top: EventMeasure['top'] }> {
  try {
    const { events, m } = parseMeasured(text, options);
    if (m.documents > 1) return { ok: false, reason: 'expected a single YAML document but found several ("---")' };
    if (m.needsConstruct) construct(text, events, { ...options, allowDuplicateKeys: true });
    return { ok: true, value: { top: m.top } };
  } catch (e) {
    limitFailure(e, options.field);
    return failure(e);
  }
}

/** Several documents (local manifests), as parseYaml reads one; `maxExpandedBytes` bounds each. */
export function parseYamlAll(
  text: string,
  options: Omit<YamlOptions, 'allowDuplicateKeys'> = {},
): YamlResult<unknown[]> {
  try {
    const { events } = parseMeasured(text, options);
    return { ok: true, value: construct(text, events, options) };
  } catch (e) {
    limitFailure(e, options.field);
    return failure(e);
  }
}

/** Where a parse failed, as "line L, column C", for messages. */
export function where(r: { line?: number; column?: number }): string {
  return r.line !== undefined ? `line ${r.line}, column ${r.column}` : 'unknown position';
}

/** Whether `v` is a non-null object that is not an array: a parsed YAML mapping. */
export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * Sets a key that comes from users as an own property: `obj['__proto__'] = v` would replace the
 * prototype instead (js-yaml defines such keys the same way).
 */
export function setKey(obj: Record<string, unknown>, key: string, value: unknown): void {
  if (key === '__proto__')
    Object.defineProperty(obj, key, { value, enumerable: true, configurable: true, writable: true });
  else obj[key] = value;
}

/**
 * YAML that vmseed generates (merged cloud-config, network-config v2). js-yaml quotes strings
 * PyYAML's YAML 1.1 would read as something else ('0644', '52:54:00:12:34:00', 'yes'); no line
 * folding, no anchors, so the bytes depend on the content only.
 */
export function dumpYaml(value: unknown): string {
  return dump(value, { lineWidth: -1, noRefs: true });
}
