// The part of an API server `kubectl apply` and `kubectl create` meet, for
// the fake API server (fake-kube.ts): discovery as kubectl reads it when the
// server offers no aggregated discovery (`/api`, `/apis`, one
// APIResourceList per group version), and create, get and server-side apply
// of the kinds a vmseed install holds, with the API server's admission
// rules that an install can trip on (the namespace must exist; a name is
// created once) and its Status messages. The kinds are those of a cluster
// with KubeVirt, cert-manager and the Prometheus Operator installed, the
// prerequisites docs/operations.md names. Secrets, ConfigMaps, Events and
// VMIs are fake-kube.ts's own (watches, the agent's paths); they are listed
// here for discovery only.
import { randomUUID } from 'node:crypto';

export interface ResourceType {
  group: string; // '' for core
  version: string;
  resource: string;
  kind: string;
  namespaced: boolean;
}

const t = (group: string, version: string, resource: string, kind: string, namespaced = true): ResourceType => ({
  group,
  version,
  resource,
  kind,
  namespaced,
});

export const RESOURCE_TYPES: readonly ResourceType[] = [
  t('', 'v1', 'namespaces', 'Namespace', false),
  t('', 'v1', 'serviceaccounts', 'ServiceAccount'),
  t('', 'v1', 'services', 'Service'),
  t('', 'v1', 'secrets', 'Secret'),
  t('', 'v1', 'configmaps', 'ConfigMap'),
  t('', 'v1', 'events', 'Event'),
  t('apps', 'v1', 'daemonsets', 'DaemonSet'),
  t('apps', 'v1', 'deployments', 'Deployment'),
  t('policy', 'v1', 'poddisruptionbudgets', 'PodDisruptionBudget'),
  t('rbac.authorization.k8s.io', 'v1', 'clusterroles', 'ClusterRole', false),
  t('rbac.authorization.k8s.io', 'v1', 'clusterrolebindings', 'ClusterRoleBinding', false),
  t('rbac.authorization.k8s.io', 'v1', 'roles', 'Role'),
  t('rbac.authorization.k8s.io', 'v1', 'rolebindings', 'RoleBinding'),
  t('networking.k8s.io', 'v1', 'networkpolicies', 'NetworkPolicy'),
  t('scheduling.k8s.io', 'v1', 'priorityclasses', 'PriorityClass', false),
  t('admissionregistration.k8s.io', 'v1', 'mutatingwebhookconfigurations', 'MutatingWebhookConfiguration', false),
  // Enforced on VMI PATCH by fake-kube.ts (admission-policy-eval.ts), stored here.
  t('admissionregistration.k8s.io', 'v1', 'validatingadmissionpolicies', 'ValidatingAdmissionPolicy', false),
  t(
    'admissionregistration.k8s.io',
    'v1',
    'validatingadmissionpolicybindings',
    'ValidatingAdmissionPolicyBinding',
    false,
  ),
  t('kubevirt.io', 'v1', 'virtualmachineinstances', 'VirtualMachineInstance'),
  t('kubevirt.io', 'v1', 'virtualmachines', 'VirtualMachine'),
  t('cert-manager.io', 'v1', 'certificates', 'Certificate'),
  t('cert-manager.io', 'v1', 'issuers', 'Issuer'),
  t('monitoring.coreos.com', 'v1', 'servicemonitors', 'ServiceMonitor'),
  t('monitoring.coreos.com', 'v1', 'podmonitors', 'PodMonitor'),
  t('monitoring.coreos.com', 'v1', 'prometheusrules', 'PrometheusRule'),
];

// What a fresh cluster already has.
const INITIAL_NAMESPACES = ['default', 'kube-system', 'kube-public', 'kube-node-lease'];

export interface StoredObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; uid?: string; resourceVersion?: string; [k: string]: unknown };
  [k: string]: unknown;
}

export interface Reply {
  code: number;
  body: unknown;
}

export function failure(code: number, reason: string, message: string, details?: Record<string, unknown>): Reply {
  return {
    code,
    body: {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message,
      reason,
      code,
      ...(details ? { details } : {}),
    },
  };
}

export type Admitted = { object: StoredObject } | { refused: Reply };
const refuse = (...args: Parameters<typeof failure>): Admitted => ({ refused: failure(...args) });

const groupVersion = (r: { group: string; version: string }) => (r.group ? `${r.group}/${r.version}` : r.version);
// `daemonsets.apps`, `secrets`: how the API server names a resource in messages.
const qualified = (r: ResourceType) => (r.group ? `${r.resource}.${r.group}` : r.resource);

export function resourceType(group: string, resource: string): ResourceType | undefined {
  return RESOURCE_TYPES.find((r) => r.group === group && r.resource === resource);
}

// The type of an object's apiVersion and kind, as kubectl maps it.
export function typeOfKind(apiVersion: string, kind: string): ResourceType | undefined {
  return RESOURCE_TYPES.find((r) => groupVersion(r) === apiVersion && r.kind === kind);
}

// The discovery documents, by path; undefined for any other path.
export function discovery(path: string): unknown {
  if (path === '/version') return { major: '1', minor: '32', gitVersion: 'v1.32.0-fake', platform: 'linux/amd64' };
  if (path === '/api') return { kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [] };
  const groups = [...new Set(RESOURCE_TYPES.filter((r) => r.group !== '').map((r) => r.group))];
  if (path === '/apis')
    return {
      kind: 'APIGroupList',
      apiVersion: 'v1',
      groups: groups.map((name) => {
        const v = { groupVersion: `${name}/v1`, version: 'v1' };
        return { name, versions: [v], preferredVersion: v };
      }),
    };
  const m = /^\/(?:api\/(v1)|apis\/([^/]+)\/(v1))$/.exec(path);
  if (!m) return undefined;
  const group = m[2] ?? '';
  const types = RESOURCE_TYPES.filter((r) => r.group === group);
  if (types.length === 0) return undefined;
  return {
    kind: 'APIResourceList',
    apiVersion: 'v1',
    groupVersion: groupVersion({ group, version: 'v1' }),
    resources: types.map((r) => ({
      name: r.resource,
      singularName: r.kind.toLowerCase(),
      namespaced: r.namespaced,
      kind: r.kind,
      verbs: ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'],
    })),
  };
}

// The objects of the kinds this module stores, as a real API server keeps
// them: uid, resourceVersion, creationTimestamp set on create.
export class ApiObjects {
  readonly #objects = new Map<string, StoredObject>();
  readonly #nextRv: () => string;

  constructor(nextRv: () => string) {
    this.#nextRv = nextRv;
    for (const name of INITIAL_NAMESPACES)
      this.#store(resourceType('', 'namespaces')!, { apiVersion: 'v1', kind: 'Namespace', metadata: { name } });
  }

  #key(r: ResourceType, namespace: string | undefined, name: string): string {
    return `${qualified(r)}/${r.namespaced ? (namespace ?? '') : ''}/${name}`;
  }

  namespaceExists(name: string): boolean {
    return this.#objects.has(this.#key(resourceType('', 'namespaces')!, undefined, name));
  }

  get(r: ResourceType, namespace: string | undefined, name: string): StoredObject | undefined {
    return this.#objects.get(this.#key(r, namespace, name));
  }

  // Every stored object, in creation order.
  all(): StoredObject[] {
    return [...this.#objects.values()];
  }

  // What a controller does to an object (cert-manager's CA injector, say).
  replace(r: ResourceType, obj: StoredObject): void {
    const key = this.#key(r, obj.metadata.namespace, obj.metadata.name);
    if (!this.#objects.has(key)) throw new Error(`no ${r.kind} ${obj.metadata.namespace ?? ''}/${obj.metadata.name}`);
    obj.metadata.resourceVersion = this.#nextRv();
    this.#objects.set(key, structuredClone(obj));
  }

  #store(r: ResourceType, obj: StoredObject): StoredObject {
    const o = structuredClone(obj);
    o.metadata.uid = randomUUID();
    o.metadata.resourceVersion = this.#nextRv();
    o.metadata.creationTimestamp = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
    o.metadata.generation = 1;
    this.#objects.set(this.#key(r, o.metadata.namespace, o.metadata.name), o);
    return o;
  }

  // The API server's checks of a create: an object of this kind, named,
  // in an existing namespace, under a name not taken yet.
  admit(r: ResourceType, namespace: string | undefined, body: string, taken: (name: string) => boolean): Admitted {
    const parsed = parseObject(r, namespace, body);
    if ('refused' in parsed) return parsed;
    const name = parsed.object.metadata.name;
    if (r.namespaced && !this.namespaceExists(namespace!))
      return refuse(404, 'NotFound', `namespaces "${namespace}" not found`, { name: namespace, kind: 'namespaces' });
    if (taken(name))
      return refuse(409, 'AlreadyExists', `${qualified(r)} "${name}" already exists`, {
        name,
        group: r.group,
        kind: r.resource,
      });
    return parsed;
  }

  // POST to the collection. `namespace` is the request path's.
  create(r: ResourceType, namespace: string | undefined, body: string): Reply {
    const a = this.admit(r, namespace, body, (name) => this.get(r, namespace, name) !== undefined);
    return 'refused' in a ? a.refused : { code: 201, body: this.#store(r, a.object) };
  }

  read(r: ResourceType, namespace: string | undefined, name: string): Reply {
    const o = this.get(r, namespace, name);
    return o
      ? { code: 200, body: o }
      : failure(404, 'NotFound', `${qualified(r)} "${name}" not found`, { name, group: r.group, kind: r.resource });
  }

  // Server-side apply (PATCH, application/apply-patch+yaml) as far as an
  // install goes: creates the object, or replaces what it holds.
  apply(r: ResourceType, namespace: string | undefined, name: string, body: string): Reply {
    const a = parseObject(r, namespace, body);
    if ('refused' in a) return a.refused;
    const parsed = a.object;
    if (parsed.metadata.name !== name)
      return failure(400, 'BadRequest', 'the name of the object does not match the name on the URL');
    const prev = this.get(r, namespace, name);
    if (!prev) return this.create(r, namespace, body);
    const next = { ...parsed, metadata: { ...parsed.metadata, uid: prev.metadata.uid } };
    this.replace(r, next);
    return { code: 200, body: this.get(r, namespace, name) };
  }
}

// The checks the API server makes of any body before admission.
function parseObject(r: ResourceType, namespace: string | undefined, body: string): Admitted {
  let obj: StoredObject;
  try {
    obj = JSON.parse(body) as StoredObject;
  } catch {
    return refuse(400, 'BadRequest', 'the request body is not JSON');
  }
  if (obj.apiVersion !== groupVersion(r) || obj.kind !== r.kind)
    return refuse(
      400,
      'BadRequest',
      `the API version in the data (${obj.apiVersion}) does not match the expected API version (${groupVersion(r)})`,
    );
  if (typeof obj.metadata?.name !== 'string' || obj.metadata.name === '')
    return refuse(
      422,
      'Invalid',
      `${r.kind} "" is invalid: metadata.name: Required value: name or generateName is required`,
    );
  if (r.namespaced) {
    if (obj.metadata.namespace !== undefined && obj.metadata.namespace !== namespace)
      return refuse(
        400,
        'BadRequest',
        'the namespace of the provided object does not match the namespace sent on the request',
      );
    obj.metadata.namespace = namespace;
  } else {
    delete obj.metadata.namespace;
  }
  return { object: obj };
}

// --- kubectl's protobuf ------------------------------------------------------

// `kubectl create secret` and `create configmap` send the built-in kinds as
// protobuf (application/vnd.kubernetes.protobuf): the `k8s\0` magic, then a
// runtime.Unknown {1: TypeMeta {1: apiVersion, 2: kind}, 2: raw} whose raw
// is the object (k8s.io/api/core/v1 generated.proto): Secret {1: metadata,
// 2: data map<string, bytes>, 3: type, 4: stringData}, ConfigMap
// {1: metadata, 2: data map<string, string>, 3: binaryData}; ObjectMeta
// {1: name, 3: namespace, 11: labels, 12: annotations}. Decoded to the
// JSON form, which is what the fake stores.
const MAGIC = Buffer.from('k8s\0', 'latin1');

type Fields = Map<number, Buffer[]>;

function fields(buf: Buffer): Fields {
  const out: Fields = new Map();
  let i = 0;
  const varint = (): number => {
    let v = 0;
    for (let shift = 0; ; shift += 7) {
      if (i >= buf.length || shift > 35) throw new Error('truncated protobuf varint');
      const b = buf[i++];
      v += (b & 0x7f) * 2 ** shift;
      if (b < 0x80) return v;
    }
  };
  while (i < buf.length) {
    const key = varint();
    const wire = key & 7;
    let value: Buffer;
    if (wire === 0) value = Buffer.from(String(varint()));
    else if (wire === 2) {
      const len = varint();
      if (i + len > buf.length) throw new Error('truncated protobuf field');
      value = buf.subarray(i, i + len);
      i += len;
    } else throw new Error(`protobuf wire type ${wire} is not used by these kinds`);
    const n = Math.floor(key / 8);
    out.set(n, [...(out.get(n) ?? []), value]);
  }
  return out;
}

const str = (f: Fields, n: number): string | undefined => f.get(n)?.at(-1)?.toString('utf8');

function map(f: Fields, n: number, value: (b: Buffer) => string): Record<string, string> | undefined {
  const entries = f.get(n);
  if (!entries) return undefined;
  return Object.fromEntries(
    entries.map((e) => {
      const kv = fields(e);
      return [str(kv, 1) ?? '', value(kv.get(2)?.at(-1) ?? Buffer.alloc(0))];
    }),
  );
}

// The JSON text of a protobuf-encoded Secret or ConfigMap, or the body as it
// came when it is not protobuf.
export function jsonBody(body: Buffer): string {
  if (!body.subarray(0, 4).equals(MAGIC)) return body.toString('utf8');
  const unknown = fields(body.subarray(4));
  const typeMeta = fields(unknown.get(1)?.at(-1) ?? Buffer.alloc(0));
  const kind = str(typeMeta, 2);
  const raw = fields(unknown.get(2)?.at(-1) ?? Buffer.alloc(0));
  const meta = fields(raw.get(1)?.at(-1) ?? Buffer.alloc(0));
  const text = (b: Buffer) => b.toString('utf8');
  const metadata = {
    name: str(meta, 1),
    ...(str(meta, 3) ? { namespace: str(meta, 3) } : {}),
    ...(meta.has(11) ? { labels: map(meta, 11, text) } : {}),
    ...(meta.has(12) ? { annotations: map(meta, 12, text) } : {}),
  };
  const obj: Record<string, unknown> = { apiVersion: str(typeMeta, 1), kind, metadata };
  if (kind === 'Secret') {
    obj.data = map(raw, 2, (b) => b.toString('base64')) ?? {};
    if (str(raw, 3)) obj.type = str(raw, 3);
    if (raw.has(4)) obj.stringData = map(raw, 4, text);
  } else if (kind === 'ConfigMap') {
    obj.data = map(raw, 2, text) ?? {};
    if (raw.has(3)) obj.binaryData = map(raw, 3, (b) => b.toString('base64'));
  } else {
    throw new Error(`protobuf ${kind} is not decoded by the fake API server`);
  }
  return JSON.stringify(obj);
}
