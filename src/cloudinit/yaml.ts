// One place that parses YAML for src/cloudinit, so every caller reports errors
// the same way: 1-based line and column plus the parser's reason, never the
// source snippet (it would quote user-data or Secret content into Events).
//
// Every parse is bounded (issue 14): js-yaml's own maxAliases and maxDepth
// stop an alias bomb or a deep nest while parsing, and the parsed value is
// measured as if every alias were expanded (what JSON.stringify, dump or a
// merge would walk) before anyone serialises it. Aliases share objects, so
// the measure counts a shared node each time it is reached and stops as
// soon as the bound is passed: its cost is bounded by the bound, not by the
// expansion.
import { dump, loadAll, YAMLException } from 'js-yaml';
import { VmseedError } from '../errors.ts';
import { LIMITS } from './limits.ts';

export type YamlResult<T> = { ok: true; value: T } | { ok: false; line?: number; column?: number; reason: string };

export interface YamlOptions {
  // PyYAML (cloud-init) lets a later duplicate key win; js-yaml rejects it unless asked.
  allowDuplicateKeys?: boolean;
  // The input field, for YAML_TOO_COMPLEX.
  field?: string;
  // Bound on the parsed value's expanded size (default
  // LIMITS.yamlExpandedBytes), never below 4 × the text's own length: a
  // document without aliases measures a small multiple of its text.
  maxExpandedBytes?: number;
}

const LOAD_LIMITS = { maxAliases: LIMITS.yamlAliases, maxDepth: LIMITS.yamlDepth } as const;

function tooComplex(field: string | undefined, what: string): VmseedError {
  return new VmseedError('YAML_TOO_COMPLEX', `${field ?? 'YAML'}: ${what}; write the data out instead of using anchors and aliases, or nest less`, {
    kind: 'terminal',
    ...(field ? { field } : {}),
  });
}

// About the size in bytes the value would have serialised (as JSON, or as
// block YAML with its indentation), or 'over' once it passes `limit`, or
// 'cycle' for a value that contains itself (a recursive alias `&a [*a]`).
export function measureExpanded(value: unknown, limit: number): number | 'over' | 'cycle' {
  let total = 0;
  const path = new Set<object>();
  const visit = (v: unknown): boolean => {
    const indent = 2 * path.size;
    if (typeof v === 'string') total += v.length + 2;
    else if (v === null || typeof v !== 'object') total += 8;
    else if (v instanceof Uint8Array) total += v.length;
    else if (v instanceof Date) total += 26;
    else {
      if (path.has(v)) return false;
      path.add(v);
      total += 2;
      if (Array.isArray(v)) {
        for (const x of v) {
          total += 3 + indent;
          if (total > limit || !visit(x)) return false;
        }
      } else {
        const o = v as Record<string, unknown>;
        for (const k of Object.keys(o)) {
          total += k.length + 4 + indent;
          if (total > limit || !visit(o[k])) return false;
        }
      }
      path.delete(v);
    }
    return total <= limit;
  };
  const ok = visit(value);
  if (ok) return total;
  return total > limit ? 'over' : 'cycle';
}

// Throws YAML_TOO_COMPLEX unless the value expands to at most `limit` bytes.
export function checkExpanded(value: unknown, limit: number, field: string | undefined): number {
  const m = measureExpanded(value, limit);
  if (m === 'cycle') throw tooComplex(field, 'a recursive alias makes the document contain itself');
  if (m === 'over') throw tooComplex(field, `with its aliases expanded the document is more than ${limit} bytes`);
  return m;
}

// js-yaml's limit errors become YAML_TOO_COMPLEX, not a syntax error.
function limitFailure(e: unknown, field: string | undefined): void {
  if (!(e instanceof YAMLException)) return;
  if (e.reason.startsWith('aliases exceeded maxAliases')) throw tooComplex(field, `more than ${LIMITS.yamlAliases} aliases (*name)`);
  if (e.reason.startsWith('nesting exceeded maxDepth')) throw tooComplex(field, `nested more than ${LIMITS.yamlDepth} levels deep`);
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

export function parseYaml(text: string, options: YamlOptions = {}): YamlResult<unknown> {
  try {
    // An empty or comment-only document is null in PyYAML; js-yaml's load throws.
    const docs = loadAll(text, { json: options.allowDuplicateKeys === true, ...LOAD_LIMITS });
    if (docs.length > 1) return { ok: false, reason: 'expected a single YAML document but found several ("---")' };
    const value = docs.length === 0 ? null : docs[0];
    // Without a "*" there is no alias, so nothing expands and nothing is cyclic.
    if (text.includes('*')) checkExpanded(value, Math.max(options.maxExpandedBytes ?? LIMITS.yamlExpandedBytes, 4 * text.length), options.field);
    return { ok: true, value };
  } catch (e) {
    limitFailure(e, options.field);
    return failure(e);
  }
}

// Several documents (local manifests). `maxExpandedBytes` bounds each.
export function parseYamlAll(text: string, options: Omit<YamlOptions, 'allowDuplicateKeys'> = {}): YamlResult<unknown[]> {
  try {
    const docs = loadAll(text, LOAD_LIMITS);
    if (text.includes('*')) for (const d of docs) checkExpanded(d, Math.max(options.maxExpandedBytes ?? LIMITS.yamlExpandedBytes, 4 * text.length), options.field);
    return { ok: true, value: docs };
  } catch (e) {
    limitFailure(e, options.field);
    return failure(e);
  }
}

export function where(r: { line?: number; column?: number }): string {
  return r.line !== undefined ? `line ${r.line}, column ${r.column}` : 'unknown position';
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// Sets a key that comes from users as an own property: `obj['__proto__'] = v`
// would replace the prototype instead (js-yaml defines such keys the same way).
export function setKey(obj: Record<string, unknown>, key: string, value: unknown): void {
  if (key === '__proto__') Object.defineProperty(obj, key, { value, enumerable: true, configurable: true, writable: true });
  else obj[key] = value;
}

// YAML that vmseed generates (merged cloud-config, network-config v2). js-yaml
// quotes strings PyYAML's YAML 1.1 would read as something else ('0644',
// '52:54:00:12:34:00', 'yes'); no line folding, no anchors, so the bytes
// depend on the content only.
export function dumpYaml(value: unknown): string {
  return dump(value, { lineWidth: -1, noRefs: true });
}
