// Loading the deployment manifests and validating them: built-in kinds
// against the Kubernetes OpenAPI schemas (kubernetes-models), the Prometheus
// Operator CRDs against a small structural schema of the fields we use.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as yaml from 'js-yaml';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  [key: string]: unknown;
}

export function loadYamlDocuments(relativePath: string): KubeObject[] {
  const text = readFileSync(ROOT + relativePath, 'utf8');
  return yaml.loadAll(text).filter((d) => d !== null && d !== undefined) as KubeObject[];
}

export function findObject(objects: KubeObject[], kind: string, name?: string): KubeObject {
  const found = objects.filter((o) => o.kind === kind && (name === undefined || o.metadata.name === name));
  if (found.length !== 1) throw new Error(`expected one ${kind}${name ? ` ${name}` : ''}, found ${found.length}`);
  return found[0];
}

// kubernetes-models lays its classes out by group and version:
// `kubernetes-models/apps/v1` exports DaemonSet, `kubernetes-models/v1`
// the core group.
async function modelClass(apiVersion: string, kind: string): Promise<new (data: unknown) => { validate(): void }> {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  const modulePath = group === '' ? `kubernetes-models/${version}` : `kubernetes-models/${group}/${version}`;
  const mod = (await import(modulePath)) as Record<string, unknown>;
  const cls = mod[kind];
  if (typeof cls !== 'function') throw new Error(`kubernetes-models has no ${kind} in ${modulePath}`);
  return cls as new (data: unknown) => { validate(): void };
}

// Throws with the schema violation (path + reason) when the object is not a
// valid instance of its kind.
export async function validateBuiltin(object: unknown): Promise<void> {
  const o = object as { apiVersion?: unknown; kind?: unknown };
  if (typeof o.apiVersion !== 'string' || typeof o.kind !== 'string')
    throw new Error('apiVersion and kind are required');
  const Model = await modelClass(o.apiVersion, o.kind);
  new Model(object).validate();
}

// --- a structural schema for CRD objects -------------------------------------

export type Schema =
  | { type: 'string'; enum?: string[]; pattern?: RegExp }
  | { type: 'integer' }
  | { type: 'boolean' }
  | { type: 'intOrString' }
  | { type: 'array'; items: Schema; minItems?: number }
  | { type: 'map'; values: Schema }
  | { type: 'object'; properties: Record<string, Schema>; required?: string[]; open?: boolean };

// Returns every violation as `path: reason`; an empty list means valid.
// Objects are closed (unknown fields are errors, catching typos) unless `open`.
export function checkSchema(value: unknown, schema: Schema, path = ''): string[] {
  const at = path === '' ? '(root)' : path;
  switch (schema.type) {
    case 'string':
      if (typeof value !== 'string') return [`${at}: must be a string`];
      if (schema.enum && !schema.enum.includes(value)) return [`${at}: must be one of ${schema.enum.join(', ')}`];
      if (schema.pattern && !schema.pattern.test(value)) return [`${at}: does not match ${schema.pattern}`];
      return [];
    case 'integer':
      return Number.isInteger(value) ? [] : [`${at}: must be an integer`];
    case 'boolean':
      return typeof value === 'boolean' ? [] : [`${at}: must be a boolean`];
    case 'intOrString':
      return Number.isInteger(value) || typeof value === 'string' ? [] : [`${at}: must be an integer or a string`];
    case 'array': {
      if (!Array.isArray(value)) return [`${at}: must be an array`];
      const errors: string[] = [];
      if (schema.minItems !== undefined && value.length < schema.minItems)
        errors.push(`${at}: needs at least ${schema.minItems} item(s)`);
      value.forEach((v, i) => errors.push(...checkSchema(v, schema.items, `${path}[${i}]`)));
      return errors;
    }
    case 'map': {
      if (typeof value !== 'object' || value === null || Array.isArray(value)) return [`${at}: must be an object`];
      return Object.entries(value).flatMap(([k, v]) => checkSchema(v, schema.values, `${path}.${k}`));
    }
    case 'object': {
      if (typeof value !== 'object' || value === null || Array.isArray(value)) return [`${at}: must be an object`];
      const record = value as Record<string, unknown>;
      const errors: string[] = [];
      for (const key of schema.required ?? [])
        if (!(key in record)) errors.push(`${at}: missing required field ${key}`);
      for (const [key, v] of Object.entries(record)) {
        const sub = schema.properties[key];
        if (sub === undefined) {
          if (!schema.open) errors.push(`${path}.${key}: unknown field`);
          continue;
        }
        errors.push(...checkSchema(v, sub, path === '' ? key : `${path}.${key}`));
      }
      return errors;
    }
  }
}

// Prometheus Operator's duration format (monitoring.coreos.com/v1 Duration).
const DURATION = /^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$/;
const str: Schema = { type: 'string' };
const strMap: Schema = { type: 'map', values: str };
const metadata: Schema = {
  type: 'object',
  required: ['name', 'namespace'],
  properties: { name: str, namespace: str, labels: strMap, annotations: strMap },
};
const labelSelector: Schema = {
  type: 'object',
  properties: {
    matchLabels: strMap,
    matchExpressions: { type: 'array', items: { type: 'object', open: true, properties: {} } },
  },
};

export const SERVICE_MONITOR_SCHEMA: Schema = {
  type: 'object',
  required: ['apiVersion', 'kind', 'metadata', 'spec'],
  properties: {
    apiVersion: { type: 'string', enum: ['monitoring.coreos.com/v1'] },
    kind: { type: 'string', enum: ['ServiceMonitor'] },
    metadata,
    spec: {
      type: 'object',
      required: ['selector', 'endpoints'],
      properties: {
        jobLabel: str,
        selector: labelSelector,
        namespaceSelector: {
          type: 'object',
          properties: { any: { type: 'boolean' }, matchNames: { type: 'array', items: str } },
        },
        endpoints: {
          type: 'array',
          minItems: 1,
          items: {
            type: 'object',
            properties: {
              port: str,
              targetPort: { type: 'intOrString' },
              path: { type: 'string', pattern: /^\// },
              scheme: { type: 'string', enum: ['http', 'https'] },
              interval: { type: 'string', pattern: DURATION },
              scrapeTimeout: { type: 'string', pattern: DURATION },
              honorLabels: { type: 'boolean' },
              relabelings: {
                type: 'array',
                items: {
                  type: 'object',
                  properties: {
                    sourceLabels: { type: 'array', items: str },
                    targetLabel: str,
                    regex: str,
                    replacement: str,
                    separator: str,
                    action: str,
                  },
                },
              },
            },
          },
        },
      },
    },
  },
};

export const PROMETHEUS_RULE_SCHEMA: Schema = {
  type: 'object',
  required: ['apiVersion', 'kind', 'metadata', 'spec'],
  properties: {
    apiVersion: { type: 'string', enum: ['monitoring.coreos.com/v1'] },
    kind: { type: 'string', enum: ['PrometheusRule'] },
    metadata,
    spec: {
      type: 'object',
      required: ['groups'],
      properties: {
        groups: {
          type: 'array',
          minItems: 1,
          items: {
            type: 'object',
            required: ['name', 'rules'],
            properties: {
              name: str,
              interval: { type: 'string', pattern: DURATION },
              rules: {
                type: 'array',
                minItems: 1,
                items: {
                  type: 'object',
                  required: ['expr'],
                  properties: {
                    alert: str,
                    record: str,
                    expr: { type: 'intOrString' },
                    for: { type: 'string', pattern: DURATION },
                    keep_firing_for: { type: 'string', pattern: DURATION },
                    labels: strMap,
                    annotations: strMap,
                  },
                },
              },
            },
          },
        },
      },
    },
  },
};
