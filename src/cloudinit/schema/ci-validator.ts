// cloud-init's schema validation, reproduced on ajv: cloud-init does not
// validate with a stock Draft 4 validator but with one whose `anyOf`, `oneOf`
// and `deprecated` (25.1: also `changed`) keywords are its own
// (cloudinit/config/schema.py, get_jsonschema_validator), and which problems
// it reports depends on them: 22.4 reports a failed anyOf/oneOf at the
// keyword's own path; 25.1 adds jsonschema's best_match for anyOf and replaces
// a failed oneOf by its deepest branch errors. Deprecations are yielded only
// from the branch that matched. So each of those keywords is an ajv keyword
// here that runs its branches (compiled lazily, on first use) and builds the
// same result; every other keyword is ajv's own.
import { createRequire } from 'node:module';
import type AjvDraft04 from 'ajv-draft-04';
import type { AnySchemaObject, ErrorObject, ValidateFunction } from 'ajv-draft-04';

// ajv is loaded on the first compile, not with the agent: a node that
// checks no seed (--cloud-init-version off) never pays for it. A CommonJS
// module whose class is its `default` export.
const require = createRequire(import.meta.url);
function ajvClass(): (typeof AjvDraft04)['default'] {
  return (require('ajv-draft-04') as typeof AjvDraft04).default;
}

/** How a release's validator behaves (see the header). */
export type CiProfile = '22.4' | '25.1';

/** One problem as cloud-init's validator yields it, before its path is joined. */
export interface CiError {
  path: (string | number)[];
  keyword: string;
  // The schema object holding the failing keyword (jsonschema's error.schema).
  schema?: AnySchemaObject;
  // What failed, for the message: the instance, and the keyword's own value.
  data?: unknown;
  params?: Record<string, unknown>;
  context?: CiError[];
  deprecation?: string;
}

/** Thrown when a walk runs more anyOf/oneOf branches than its budget allows. */
export class SchemaWalkBudgetError extends Error {}

/** A compiled schema: validate(data) gives cloud-init's errors and deprecations. */
export interface CiValidator {
  // maxBranches bounds the anyOf/oneOf branches one walk may run: each runs
  // ajv over the branch's part of the document.
  validate(data: unknown, maxBranches: number): { errors: CiError[]; deprecations: CiError[] };
  // Top-level property name → the cloud-init module ($defs/cc_*) that declares it.
  modules: ReadonlyMap<string, string>;
}

const ROOT_ID = 'ci://schema';

// Deprecations found while a branch runs; a branch that fails drops its own.
let sinks: CiError[][] = [];
// Branches the current walk may still run.
let branchesLeft = Infinity;

function pointerToPath(pointer: string): (string | number)[] {
  if (pointer === '') return [];
  return pointer
    .slice(1)
    .split('/')
    .map((s) => {
      const k = s.replace(/~1/g, '/').replace(/~0/g, '~');
      return /^(0|[1-9][0-9]*)$/.test(k) ? Number(k) : k;
    });
}

interface DataCxt {
  instancePath: string;
  parentData: unknown;
  parentDataProperty: string | number;
  rootData: unknown;
  dynamicAnchors: Record<string, unknown>;
}

function fromAjv(errors: readonly ErrorObject[] | null | undefined): CiError[] {
  const out: CiError[] = [];
  const extras = new Map<string, CiError>();
  for (const e of errors ?? []) {
    const ci = (e.params as { ci?: CiError[] }).ci;
    if (ci) {
      out.push(...ci);
      continue;
    }
    const path = pointerToPath(e.instancePath);
    // jsonschema yields one additionalProperties error per object, naming
    // every unexpected key; ajv one per key.
    if (e.keyword === 'additionalProperties') {
      const key = `${e.instancePath}\0${e.schemaPath}`;
      const prev = extras.get(key);
      const name = (e.params as { additionalProperty: string }).additionalProperty;
      if (prev) {
        (prev.params!.extras as string[]).push(name);
        continue;
      }
      const err: CiError = {
        path,
        keyword: e.keyword,
        schema: e.parentSchema,
        data: e.data,
        params: { extras: [name], root: e.parentSchema?.id === ROOT_ID },
      };
      extras.set(key, err);
      out.push(err);
      continue;
    }
    out.push({
      path,
      keyword: e.keyword,
      schema: e.parentSchema,
      data: e.data,
      params: { ...(e.params as Record<string, unknown>), value: e.schema },
    });
  }
  return out;
}

// jsonschema.exceptions.relevance: shallow first, anyOf/oneOf last.
function relevance(e: CiError): [number, number] {
  return [-e.path.length, e.keyword === 'anyOf' || e.keyword === 'oneOf' ? 0 : 1];
}

function cmp(a: [number, number], b: [number, number]): number {
  return a[0] - b[0] || a[1] - b[1];
}

// jsonschema.exceptions.best_match (4.10): max by relevance (the first of
// equals), then down its context while one error is strictly the deepest.
export function bestMatch(errors: CiError[]): CiError | undefined {
  let best: CiError | undefined;
  for (const e of errors) if (!best || cmp(relevance(e), relevance(best)) > 0) best = e;
  while (best?.context && best.context.length > 0) {
    const sorted = best.context
      .map((e, i) => ({ e, i }))
      .sort((a, b) => cmp(relevance(a.e), relevance(b.e)) || a.i - b.i);
    if (sorted.length >= 2 && cmp(relevance(sorted[0].e), relevance(sorted[1].e)) === 0) return best;
    best = sorted[0].e;
  }
  return best;
}

// cloud-init 25.1 cloud_init_deepest_matches.
function deepestMatches(errors: CiError[], instance: unknown, base: number): CiError[] {
  let best: CiError[] = [];
  let depth = 0;
  const isType = isObject(instance) && 'type' in instance;
  const typeValue = isType ? instance.type : undefined;
  for (const err of errors) {
    const rel = err.path.slice(base);
    if (isType) {
      const typeEnum = (err.schema?.properties as Record<string, { enum?: unknown[] }> | undefined)?.type?.enum ?? [];
      if (typeEnum.some((v) => v === typeValue)) return [err];
      if (jsonPath(rel).endsWith('type')) best.push(err);
    } else if (rel.length === depth) best.push(err);
    else if (rel.length > depth) {
      depth = rel.length;
      best = [err];
    }
  }
  return best;
}

function jsonPath(p: (string | number)[]): string {
  return '$' + p.map((k) => (typeof k === 'number' ? `[${k}]` : `.${k}`)).join('');
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// cloud-init's message for a deprecated (or 25.1 changed) schema.
function deprecationMessage(profile: CiProfile, schema: AnySchemaObject, key: 'deprecated' | 'changed'): string {
  const description = typeof schema.description === 'string' ? schema.description : '';
  if (profile === '22.4') return description ? `DEPRECATED: ${description}` : 'DEPRECATED.';
  const s = schema as Record<string, unknown>;
  const version = s[`${key}_version`] ?? `<missing ${key}_version key, please file a bug report>`;
  const extra = s[`${key}_description`];
  const cap = key[0].toUpperCase() + key.slice(1);
  return `${description} ${cap} in version ${String(version)}. ${typeof extra === 'string' ? extra : ''}`.trimEnd();
}

// Every "$ref": "#/..." made absolute, so that a branch compiled on its own
// resolves against the schema it came from; anyOf/oneOf renamed to ours.
function prepare(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(prepare);
  if (!isObject(node)) return node;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === '$schema' || k === '$id' || k === 'id') continue;
    if (k === '$ref' && typeof v === 'string' && v.startsWith('#')) out.$ref = ROOT_ID + v;
    else if (k === 'anyOf') out.ciAnyOf = prepare(v);
    else if (k === 'oneOf') out.ciOneOf = prepare(v);
    else if (k === 'deprecated') out.ciDeprecated = v;
    else if (k === 'changed') out.ciChanged = v;
    else out[k] = prepare(v);
  }
  return out;
}

// jsonschema's FormatChecker checks only the formats whose libraries are
// installed; of those cloud-init's schemas use "date" (hostname and uri
// need packages Debian's cloud-init does not depend on).
function isDate(s: string): boolean {
  const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s);
  if (!m) return false;
  const d = new Date(Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3])));
  return d.getUTCFullYear() === Number(m[1]) && d.getUTCMonth() === Number(m[2]) - 1 && d.getUTCDate() === Number(m[3]);
}

/** Compiles one of cloud-init's schema files (parsed JSON) as release `profile` validates it. */
export function compileCloudInitSchema(schemaJson: unknown, profile: CiProfile): CiValidator {
  const Ajv = ajvClass();
  const ajv = new Ajv({
    allErrors: true,
    strict: false,
    verbose: true,
    validateSchema: false,
    unicodeRegExp: false,
    formats: { date: isDate, hostname: true, uri: true },
    // A $ref compiled once as its own function, not inlined into every
    // schema that names it, and ajv's code optimisation off: a release's
    // validator then takes some 14 MB of RSS instead of 36 and compiles no
    // slower, and checks as fast (npm run bench:schema).
    inlineRefs: false,
    code: { optimize: false },
    // The messages are cloud-init's (problems.ts), not ajv's.
    messages: false,
  });
  const branches = new WeakMap<object, ValidateFunction>();
  const branch = (s: AnySchemaObject): ValidateFunction => {
    const known = branches.get(s);
    if (known) return known;
    const v = ajv.compile(s);
    branches.set(s, v);
    return v;
  };
  const run = (s: AnySchemaObject, data: unknown, cxt: DataCxt): { errors: CiError[]; deprecations: CiError[] } => {
    if (--branchesLeft < 0) throw new SchemaWalkBudgetError('too many anyOf/oneOf branches');
    const sink: CiError[] = [];
    sinks.push(sink);
    try {
      const v = branch(s);
      v(data, cxt as Parameters<ValidateFunction>[1]);
      return { errors: fromAjv(v.errors), deprecations: sink };
    } finally {
      sinks.pop();
    }
  };
  // A keyword function reports its errors on itself (ajv's `validate.errors`).
  const fail = (f: object, ci: CiError[], cxt: DataCxt): boolean => {
    (f as { errors?: unknown }).errors = [
      { keyword: 'ci', instancePath: cxt.instancePath, schemaPath: '', params: { ci } },
    ];
    return false;
  };
  ajv.addKeyword({
    keyword: 'ciAnyOf',
    schemaType: 'array',
    errors: true,
    validate: function anyOf(
      this: unknown,
      subs: AnySchemaObject[],
      data: unknown,
      parent?: AnySchemaObject,
      cxt?: DataCxt,
    ): boolean {
      const c = cxt!;
      const path = pointerToPath(c.instancePath);
      const all: CiError[] = [];
      const out: CiError[] = [];
      let skipBest = false;
      for (const s of subs) {
        const r = run(s, data, c);
        if (r.errors.length === 0) {
          sinks.at(-1)?.push(...r.deprecations);
          return out.length === 0 ? true : fail(anyOf, out, c);
        }
        const ref = typeof s.$ref === 'string' ? s.$ref : '';
        if (profile === '25.1' && isObject(data) && 'type' in data && ref.includes('anyOf_type')) {
          if (ref.includes(`anyOf_type_${String(data.type)}`)) {
            skipBest = true;
            out.push(...r.errors);
          }
        }
        all.push(...r.errors);
      }
      if (profile === '25.1' && !skipBest) {
        const b = bestMatch(all);
        if (b) out.push(b);
      }
      out.push({ path, keyword: 'anyOf', schema: parent, data, context: all });
      return fail(anyOf, out, c);
    },
  });
  ajv.addKeyword({
    keyword: 'ciOneOf',
    schemaType: 'array',
    errors: true,
    validate: function oneOf(
      this: unknown,
      subs: AnySchemaObject[],
      data: unknown,
      parent?: AnySchemaObject,
      cxt?: DataCxt,
    ): boolean {
      const c = cxt!;
      const path = pointerToPath(c.instancePath);
      const all: CiError[] = [];
      const out: CiError[] = [];
      let first = -1;
      let deprecations: CiError[] = [];
      for (let i = 0; i < subs.length; i++) {
        const r = run(subs[i], data, c);
        if (r.errors.length === 0) {
          first = i;
          deprecations = r.deprecations;
          break;
        }
        all.push(...r.errors);
      }
      if (first < 0) {
        if (profile === '22.4') out.push({ path, keyword: 'oneOf', schema: parent, data, context: all });
        else out.push(...deepestMatches(all, data, path.length));
        return fail(oneOf, out, c);
      }
      const moreValid = subs.slice(first + 1).some((s) => run(s, data, c).errors.length === 0);
      if (moreValid) return fail(oneOf, [{ path, keyword: 'oneOf', schema: parent, data, params: { many: true } }], c);
      sinks.at(-1)?.push(...deprecations);
      return true;
    },
  });
  for (const [keyword, key] of [
    ['ciDeprecated', 'deprecated'],
    ['ciChanged', 'changed'],
  ] as const) {
    if (key === 'changed' && profile === '22.4') {
      ajv.addKeyword({ keyword });
      continue;
    }
    ajv.addKeyword({
      keyword,
      errors: false,
      validate: (value: unknown, _data: unknown, parent?: AnySchemaObject, cxt?: DataCxt) => {
        if (value === true && parent)
          sinks.at(-1)?.push({
            path: pointerToPath(cxt!.instancePath),
            keyword: key,
            deprecation: deprecationMessage(profile, parent, key),
          });
        return true;
      },
    });
  }
  const root = prepare(schemaJson) as AnySchemaObject;
  // The cloud-config schema is an allOf of one $ref per module. A module's
  // schema that only names properties (an object's `properties`, nothing
  // that applies to the object as a whole) finds nothing in a document
  // without those keys: it is compiled and run only for a document that has
  // one, so the first check compiles the few modules it uses, not all 56.
  const lazyKeys = new Map<AnySchemaObject, string[] | undefined>();
  const keysOf = (member: AnySchemaObject): string[] | undefined => {
    if (lazyKeys.has(member)) return lazyKeys.get(member);
    const ref = typeof member.$ref === 'string' ? member.$ref : '';
    const name = ref.startsWith(`${ROOT_ID}#/$defs/`) ? ref.slice(`${ROOT_ID}#/$defs/`.length) : undefined;
    const def = name !== undefined && isObject(root.$defs) ? root.$defs[name] : undefined;
    const inert = new Set(['properties', 'description', '$comment', 'title']);
    const keys =
      Object.keys(member).length === 1 &&
      isObject(def) &&
      isObject(def.properties) &&
      Object.entries(def).every(
        ([k, v]) => inert.has(k) || (k === 'type' && v === 'object') || (k === 'additionalProperties' && v === true),
      )
        ? Object.keys(def.properties)
        : undefined;
    lazyKeys.set(member, keys);
    return keys;
  };
  ajv.addKeyword({
    keyword: 'ciModules',
    schemaType: 'array',
    errors: true,
    validate: function modules(this: unknown, members: AnySchemaObject[], data: unknown, _p?: unknown, cxt?: DataCxt) {
      const c = cxt!;
      const out: CiError[] = [];
      for (const m of members) {
        const keys = isObject(data) ? keysOf(m) : undefined;
        if (keys && !keys.some((k) => Object.hasOwn(data as object, k))) continue;
        const r = run(m, data, c);
        out.push(...r.errors);
        sinks.at(-1)?.push(...r.deprecations);
      }
      return out.length === 0 ? true : fail(modules, out, c);
    },
  });
  if (Array.isArray(root.allOf)) {
    root.ciModules = root.allOf;
    delete root.allOf;
  }
  ajv.addSchema({ ...root, id: ROOT_ID });
  const modules = moduleMap(schemaJson);
  const whole: AnySchemaObject = { $ref: ROOT_ID + '#' };
  return {
    modules,
    validate(data, maxBranches) {
      const saved = sinks;
      const left = branchesLeft;
      sinks = [];
      branchesLeft = maxBranches;
      try {
        return run(whole, data, {
          instancePath: '',
          parentData: undefined,
          parentDataProperty: '',
          rootData: data,
          dynamicAnchors: {},
        });
      } finally {
        sinks = saved;
        branchesLeft = left;
      }
    },
  };
}

function moduleMap(schemaJson: unknown): Map<string, string> {
  const out = new Map<string, string>();
  const defs = isObject(schemaJson) && isObject(schemaJson.$defs) ? schemaJson.$defs : {};
  for (const [name, def] of Object.entries(defs)) {
    if (!name.startsWith('cc_') || !isObject(def) || !isObject(def.properties)) continue;
    for (const key of Object.keys(def.properties)) if (!out.has(key)) out.set(key, name);
  }
  return out;
}
