// cloud-init's validator errors as the problems vmseed reports: the dotted
// path cloud-init prints (validate_cloudconfig_schema joins error.path with
// "."), and jsonschema's message for the keyword. A message names keys,
// types and the schema's own values; the instance's value is quoted only
// when the caller may show it (the owner's own file, inline user-data back to
// whoever submitted it), never for a Secret's content.
import type { CiError, CiProfile } from './ci-validator.ts';

/** What a problem is: cloud-init reports errors and deprecations apart. */
export type SchemaSeverity = 'error' | 'deprecation';

/** One problem found in one document, as cloud-init's `schema` command reports it. */
export interface SchemaProblem {
  severity: SchemaSeverity;
  // cloud-init's path: keys and list indices joined by ".", '' for the document.
  path: string;
  message: string;
  // The cloud-init module whose schema the top-level key belongs to
  // (cc_runcmd), "unknown" for a key no module declares, "network-config".
  module: string;
}

const MAX_REPR = 80;

/** Python's repr() of a parsed YAML value, cut to a bounded length. */
export function pyRepr(v: unknown, budget = MAX_REPR): string {
  const s = repr(v, { left: budget });
  return s.length > budget ? `${s.slice(0, budget - 3)}...` : s;
}

function repr(v: unknown, b: { left: number }): string {
  if (b.left <= 0) return '...';
  let s: string;
  if (v === null || v === undefined) s = 'None';
  else if (v === true) s = 'True';
  else if (v === false) s = 'False';
  else if (typeof v === 'number') s = Number.isInteger(v) ? String(v) : pyFloat(v);
  else if (typeof v === 'string') s = pyString(v.slice(0, b.left + 2));
  else if (Array.isArray(v)) s = `[${v.map((x) => repr(x, b)).join(', ')}]`;
  else if (v instanceof Date) s = `datetime.date(${v.getUTCFullYear()}, ${v.getUTCMonth() + 1}, ${v.getUTCDate()})`;
  else if (typeof v === 'object')
    s = `{${Object.entries(v as Record<string, unknown>)
      .map(([k, x]) => `${pyString(k)}: ${repr(x, b)}`)
      .join(', ')}}`;
  else s = String(v);
  b.left -= s.length;
  return s;
}

function pyFloat(v: number): string {
  if (Number.isNaN(v)) return 'nan';
  if (!Number.isFinite(v)) return v > 0 ? 'inf' : '-inf';
  return String(v);
}

function pyString(s: string): string {
  const q = s.includes("'") && !s.includes('"') ? '"' : "'";
  const body = s.replace(/[\\\n\r\t]/g, (c) => ({ '\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t' })[c]!);
  return q + (q === "'" ? body.replace(/'/g, "\\'") : body) + q;
}

/** The kind of a value, for a message that must not quote it ("a string"). */
export function kindOf(v: unknown): string {
  if (v === null || v === undefined) return 'null';
  if (Array.isArray(v)) return 'an array';
  if (typeof v === 'string') return 'a string';
  if (typeof v === 'boolean') return 'a boolean';
  if (typeof v === 'number') return Number.isInteger(v) ? 'an integer' : 'a number';
  if (v instanceof Date) return 'a date';
  return 'an object';
}

// At most this many items of a list are named in a message.
const MAX_LISTED = 10;

function quoteList(xs: readonly unknown[]): string {
  const shown = xs.slice(0, MAX_LISTED).map((x) => pyRepr(x, 40));
  return xs.length > MAX_LISTED ? `${shown.join(', ')}, ... (${xs.length - MAX_LISTED} more)` : shown.join(', ');
}

/** jsonschema's message for one error; `reveal` false: the instance is named by its kind only. */
export function messageOf(e: CiError, reveal: boolean): string {
  if (e.deprecation !== undefined) return e.deprecation;
  const it = reveal ? pyRepr(e.data) : kindOf(e.data);
  const p = e.params ?? {};
  switch (e.keyword) {
    case 'type': {
      const t = p.value;
      return `${it} is not of type ${Array.isArray(t) ? quoteList(t) : pyRepr(t)}`;
    }
    case 'required':
      return `${pyRepr(p.missingProperty)} is a required property`;
    case 'additionalProperties': {
      const extras = p.extras as string[];
      const patterns = e.schema?.patternProperties as Record<string, unknown> | undefined;
      if (patterns) {
        return `${quoteList([...extras].sort())} ${extras.length === 1 ? 'does' : 'do'} not match any of the regexes: ${quoteList(Object.keys(patterns).sort())}`;
      }
      return `Additional properties are not allowed (${quoteList(extras)} ${extras.length === 1 ? 'was' : 'were'} unexpected)`;
    }
    case 'enum':
      return `${it} is not one of [${quoteList((p.value as unknown[]) ?? [])}]`;
    case 'minItems':
    case 'minLength':
      return `${it} is too short`;
    case 'maxItems':
    case 'maxLength':
      return `${it} is too long`;
    case 'minProperties':
      return `${it} does not have enough properties`;
    case 'maxProperties':
      return `${it} has too many properties`;
    case 'pattern':
      return `${it} does not match ${pyRepr(p.value, 200)}`;
    case 'format':
      return `${it} is not a ${pyRepr(p.value)}`;
    case 'minimum':
      return `${it} is less than the minimum of ${String(p.value)}`;
    case 'maximum':
      return `${it} is greater than the maximum of ${String(p.value)}`;
    case 'uniqueItems':
      return `${it} has non-unique elements`;
    case 'not':
      return `${it} should not be valid under the schema`;
    case 'dependencies':
      return `${pyRepr(p.missingProperty)} is a dependency of ${pyRepr(p.property)}`;
    case 'multipleOf':
      return `${it} is not a multiple of ${String(p.value)}`;
    case 'anyOf':
      return `${it} is not valid under any of the given schemas`;
    case 'oneOf':
      return p.many
        ? `${it} is valid under more than one of the given schemas`
        : `${it} is not valid under any of the given schemas`;
    default:
      return `${it} fails ${e.keyword}`;
  }
}

/**
 * The problems cloud-init reports for these errors: paths joined with ".", sorted by path as
 * cloud-init sorts them.
 */
export function toProblems(
  errors: readonly CiError[],
  deprecations: readonly CiError[],
  o: { reveal: boolean; modules: ReadonlyMap<string, string>; profile: CiProfile; fallbackModule?: string },
): SchemaProblem[] {
  const out: SchemaProblem[] = [];
  const add = (e: CiError, severity: SchemaSeverity): void => {
    let path = e.path.map(String).join('.');
    // 25.1 validate_cloudconfig_schema: an unexpected top-level key is
    // reported at its own path when it is the only one (its regex wants "was").
    if (o.profile !== '22.4' && path === '' && e.keyword === 'additionalProperties' && e.params?.root === true) {
      const extras = e.params.extras as string[];
      if (extras.length === 1 && !e.schema?.patternProperties) path = extras[0];
    }
    const top = path === '' ? '' : path.split('.')[0];
    const module = o.fallbackModule ?? (top === '' ? 'unknown' : (o.modules.get(top) ?? 'unknown'));
    out.push({ severity, path, message: messageOf(e, o.reveal), module });
  };
  for (const e of errors) add(e, 'error');
  for (const d of deprecations) add(d, 'deprecation');
  return out.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}
