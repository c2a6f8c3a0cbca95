// A fake Kubernetes API server on loopback that speaks the real protocol as
// the agent uses it, behind what a real API server puts in front:
// - HTTPS with a CA of the test's own (test-pki.ts); `tls: false` keeps
//   plain HTTP for the few tests about something else; `http2` offers
//   HTTP/2 as the API server does (ALPN h2, HTTP/1.1 still served).
// - Authentication: a bearer token from the accepted set (the service
//   account's; `acceptTokens()` rotates it), or one of another service
//   account (`serviceAccountToken()`: the cluster component's, say), else
//   401 Unauthorized.
// - TokenReview (POST authentication.k8s.io/v1 tokenreviews), answered from
//   the tokens a test registers (`registerReviewToken()`: user, audiences,
//   extra as a pod-bound projected token has them), and Pod GETs of the pods
//   such tokens name (`setPod()`).
// - RBAC: the rules manifests/daemonset.yaml grants the agent's service
//   account (or other manifests: ClusterRole/Role with their bindings),
//   else 403 Forbidden with the API server's own message.
// - Faults on demand: 429 with Retry-After and 5xx (`fail()`), dropped
//   connections, stalled watches, refused connections, watches that ignore
//   `timeoutSeconds`.
// - Discovery and create/get/server-side apply of the other kinds an
//   install holds (fake-kube-objects.ts), so real `kubectl apply` and
//   `kubectl create` work against it with an admin token (`adminTokens`,
//   system:masters: no RBAC); `rbac: 'applied'` authorizes each service
//   account with the Roles and bindings applied so far for that account.
// Resources: VMI list (resourceVersion, label selector) and watch, cluster-
// wide or per namespace (chunked JSON lines, allowWatchBookmarks/BOOKMARK,
// timeoutSeconds honoured by ending the stream cleanly, 410 Gone as an HTTP
// status or an ERROR event), Secret/ConfigMap GET with 404 Status (and
// create/update: POST 409 AlreadyExists, PUT 409 Conflict on a stale
// resourceVersion), Event
// POST/PATCH, VMI PATCH (fake-kube-vmi-patch.ts: merge patch, with the API
// server's and KubeVirt's refusals), and KubeVirt's VMI `unpause` subresource (PUT on
// subresources.kubevirt.io, answered like virt-api: 200, 404, 409 "VMI is
// not running" / "VMI is not paused"; `onUnpause()` adds what KubeVirt
// does to the domain). Every request is logged (method,
// path, verb, resource, status) so tests can check RBAC covers exactly what
// is used.
// - Admission: the ValidatingAdmissionPolicies stored on it (applied with
//   kubectl, or `admissionPolicies` at start) are enforced as the API server's
//   ValidatingAdmissionPolicy plugin does (admission-policy-eval.ts), after
//   authentication, RBAC and the object's own validation and before
//   KubeVirt's webhook, on the VMI PATCH (an UPDATE). A token's user info
//   extra (`setTokenExtra()`: authentication.kubernetes.io/node-name, as a
//   pod-bound token on 1.30+ has it) reaches the policies' `request.userInfo`;
//   by default a token has none (a legacy token).
import { createServer as createHttpServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { createSecureServer as createHttp2Server } from 'node:http2';
import type { Socket } from 'node:net';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { KubeConnection } from '../../src/kube/connection.ts';
import type { ConfigMapObject, SecretObject, VmiObject } from '../../src/api/objects.ts';
import { requestAttributes, type RequestAttributes } from './rbac.ts';
import {
  AGENT_SERVICE_ACCOUNT,
  allows,
  forbiddenStatus,
  loadManifestObjects,
  rbacFromManifests,
  serviceAccountUser,
  type RbacPolicy,
} from './kube-authz.ts';
import { testPki, type TestPki } from './test-pki.ts';
import {
  ApiObjects,
  discovery,
  jsonBody,
  resourceType,
  typeOfKind,
  type Reply as ObjectReply,
  type ResourceType,
} from './fake-kube-objects.ts';
import { ROOT } from './manifests.ts';
import { patchVmi } from './fake-kube-vmi-patch.ts';
import {
  admitByPolicies,
  type AdmissionAttributes,
  type AdmissionPolicy,
  type AdmissionPolicyBinding,
  type UserInfo,
} from './admission-policy-eval.ts';

export type Verb = 'list' | 'watch' | 'get' | 'create' | 'patch' | 'update' | 'delete' | 'unknown';

export interface RequestRecord {
  method: string;
  path: string;
  verb: Verb;
  group: string; // '' for core
  resource: string;
  subresource?: string;
  namespace?: string;
  name?: string;
  query: Record<string, string>;
  status: number;
  // '1.1', or '2.0' over an HTTP/2 connection.
  httpVersion: string;
  // Who asked: the service account's user, or ADMIN_USER.
  user: string;
  // Date.now() when answered.
  at: number;
}

export interface StoredEvent {
  metadata: { name: string; namespace: string; resourceVersion?: string; uid?: string };
  involvedObject: { kind?: string; name?: string; namespace?: string; uid?: string };
  reason: string;
  message: string;
  type: string;
  count: number;
  firstTimestamp?: string;
  lastTimestamp?: string;
  [k: string]: unknown;
}

interface HistoryEntry {
  rv: number;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  obj: VmiObject;
  prev?: VmiObject;
  // Secrets and ConfigMaps share the history (one resourceVersion sequence, as etcd's).
  resource?: ObjectResource;
}

type ObjectResource = 'secrets' | 'configmaps';

interface Watcher {
  res: ServerResponse;
  // A Secret or ConfigMap watch (absent: VMIs), of one name with
  // fieldSelector=metadata.name=<name>.
  resource?: ObjectResource;
  name?: string;
  selector: Selector;
  // Namespaced watch: only that namespace's VMIs.
  namespace?: string;
  bookmarks: boolean;
  stalled: boolean;
  timer?: NodeJS.Timeout;
}

// A fault to answer instead of serving: matched after authentication (as
// the API server's priority-and-fairness filter) for 429, after
// authorization for 5xx.
export interface FaultRule {
  status: 429 | 500 | 502 | 503 | 504;
  method?: string;
  // Matched against the path without the query string.
  path?: RegExp;
  verb?: Verb;
  // Matched against the labelSelector query parameter (the agent's node
  // watch and its migration-target watch differ only there).
  labelSelector?: string;
  retryAfterSeconds?: number;
  // How many requests get the fault (default 1).
  times?: number;
}

type Selector = (labels: Record<string, string> | undefined) => boolean;

const VMI_PATH = '/apis/kubevirt.io/v1/virtualmachineinstances';

function parseSelector(text: string | undefined): Selector {
  if (!text) return () => true;
  const reqs = text.split(',').map((part) => {
    const ne = part.split('!=');
    if (ne.length === 2) return { key: ne[0].trim(), value: ne[1].trim(), equal: false };
    const eq = part.split(/==?/);
    return { key: eq[0].trim(), value: (eq[1] ?? '').trim(), equal: true };
  });
  return (labels) => reqs.every((r) => ((labels ?? {})[r.key] === r.value) === r.equal);
}

function status(code: number, reason: string, message: string, details?: Record<string, unknown>) {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason,
    code,
    ...(details ? { details } : {}),
  };
}

/** What TokenReview tells of a registered token. */
export interface ReviewedToken {
  username: string;
  audiences: string[];
  extra?: Record<string, string[]>;
}

export const DEFAULT_TOKEN = 'fake-token';
// The identity of `adminTokens` (kubeadm's admin kubeconfig user).
export const ADMIN_USER = 'kubernetes-admin';
const RBAC_KINDS = new Set(['ClusterRole', 'ClusterRoleBinding', 'Role', 'RoleBinding']);

export interface FakeKubeOptions {
  // Send a BOOKMARK to bookmark-enabled watches this often.
  bookmarkIntervalMs?: number;
  // HTTPS with the PKI's server certificate (default: on, with testPki()).
  tls?: boolean;
  pki?: TestPki;
  // Accepted bearer tokens (default [DEFAULT_TOKEN]).
  tokens?: string[];
  // Tokens of a cluster administrator (system:masters: never Forbidden).
  adminTokens?: string[];
  // Authorization: the objects of these manifests (default
  // manifests/daemonset.yaml), a policy, 'applied' for the RBAC objects
  // created on this server, or false for none (everything a valid token
  // asks is allowed).
  rbac?: false | unknown[] | RbacPolicy | 'applied';
  // The address to listen on (default 127.0.0.1); the PKI's certificate
  // must name it.
  host?: string;
  // Offer HTTP/2 (ALPN h2, as the API server does), HTTP/1.1 still served;
  // a number: also the streams one connection may carry (SETTINGS_MAX_CONCURRENT_STREAMS).
  http2?: boolean | number;
  // Watches end after timeoutSeconds × this (a bench runs an hour of
  // renewals in a minute). Default 1.
  watchTimeScale?: number;
  // Keep only the last this many changes (the API server's watch cache is a
  // bounded window too): resuming from before them gets 410 Gone. Default: all.
  historyLimit?: number;
  // ValidatingAdmissionPolicies (and their bindings) stored from the start,
  // as if applied: true for manifests/admission-policy.yaml, or objects (say
  // a rendered variant's: only those two kinds are taken). Default none.
  admissionPolicies?: boolean | unknown[];
}

export class FakeKube {
  readonly requests: RequestRecord[] = [];
  // Successful unpause calls, as `namespace/name`.
  readonly unpaused: string[] = [];
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();
  readonly #vmis = new Map<string, VmiObject>();
  readonly #secrets = new Map<string, SecretObject>();
  readonly #configMaps = new Map<string, ConfigMapObject>();
  readonly #events = new Map<string, StoredEvent>();
  readonly #watchers = new Set<Watcher>();
  #history: HistoryEntry[] = [];
  #rv = 1000;
  // Watches from a resourceVersion below this get 410 Gone.
  #compactedRv = 0;
  #goneMode: 'status' | 'event' = 'event';
  #stallNew = false;
  #port = 0;
  #refusing = false;
  #bookmarkTimer: NodeJS.Timeout | undefined;
  readonly #pki: TestPki | undefined;
  #tokens: Set<string>;
  readonly #adminTokens: Set<string>;
  // Bearer tokens of other service accounts (serviceAccountToken()): token → user.
  readonly #accountTokens = new Map<string, string>();
  #rbac: RbacPolicy | 'applied' | undefined;
  readonly #host: string;
  // Namespaces, RBAC, the DaemonSet...: what `kubectl apply` creates.
  readonly objects = new ApiObjects(() => String(++this.#rv));
  readonly #faults: FaultRule[] = [];
  #honourWatchTimeout = true;
  readonly #afterWatchTimeout: Array<(labelSelector: string) => void> = [];
  readonly #afterAnswer: Array<(request: RequestRecord) => void> = [];
  #historyLimit = Infinity;
  #watchTimeScale = 1;
  readonly #onUnpause: Array<(namespace: string, name: string) => void | Promise<void>> = [];
  // TokenReview: what each registered token is (tokens other services were given).
  readonly #reviewTokens = new Map<string, ReviewedToken>();
  // The user info extra a bearer token authenticates with (setTokenExtra()).
  readonly #tokenExtra = new Map<string, Record<string, string[]>>();
  readonly #pods = new Map<
    string,
    {
      metadata: {
        name: string;
        namespace: string;
        uid: string;
        ownerReferences?: Array<{ kind: string; uid: string }>;
      };
      spec: { nodeName?: string };
      status?: { podIPs: Array<{ ip: string }> };
    }
  >();

  private constructor(
    pki: TestPki | undefined,
    tokens: string[],
    rbac: RbacPolicy | 'applied' | undefined,
    options: FakeKubeOptions,
  ) {
    const http2 = options.http2 ?? false;
    this.#pki = pki;
    this.#tokens = new Set(tokens);
    this.#adminTokens = new Set(options.adminTokens ?? []);
    this.#rbac = rbac;
    this.#host = options.host ?? '127.0.0.1';
    const handler = (req: IncomingMessage, res: ServerResponse) => void this.#handle(req, res);
    // HTTP/2's compatibility API has the request and response of HTTP/1.1.
    this.#server = !pki
      ? createHttpServer(handler)
      : http2
        ? (createHttp2Server(
            {
              cert: pki.serverCert,
              key: pki.serverKey,
              allowHTTP1: true,
              ...(typeof http2 === 'number' ? { settings: { maxConcurrentStreams: http2 } } : {}),
            },
            handler as unknown as Parameters<typeof createHttp2Server>[1],
          ) as unknown as Server)
        : createHttpsServer({ cert: pki.serverCert, key: pki.serverKey }, handler);
    this.#server.on('connection', (s: Socket) => {
      this.#sockets.add(s);
      s.on('close', () => this.#sockets.delete(s));
    });
  }

  static async start(options: FakeKubeOptions = {}): Promise<FakeKube> {
    const pki = options.tls === false ? undefined : (options.pki ?? (await testPki()));
    const f = new FakeKube(pki, options.tokens ?? [DEFAULT_TOKEN], toPolicy(options.rbac), options);
    if (options.historyLimit !== undefined) f.#historyLimit = options.historyLimit;
    if (options.watchTimeScale !== undefined) f.#watchTimeScale = options.watchTimeScale;
    if (options.admissionPolicies) f.#storeAdmissionPolicies(options.admissionPolicies);
    await f.#listen(0);
    if (options.bookmarkIntervalMs) {
      f.#bookmarkTimer = setInterval(() => f.bookmark(), options.bookmarkIntervalMs);
      f.#bookmarkTimer.unref();
    }
    return f;
  }

  async #listen(port: number): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.#server.once('error', reject);
      this.#server.listen(port, this.#host, () => {
        this.#server.off('error', reject);
        resolve();
      });
    });
    this.#port = (this.#server.address() as { port: number }).port;
  }

  get url(): string {
    return `${this.#pki ? 'https' : 'http'}://${this.#host}:${this.#port}`;
  }

  get port(): number {
    return this.#port;
  }

  get host(): string {
    return this.#host;
  }

  // The CA a client must trust (undefined with `tls: false`).
  get caCert(): string | undefined {
    return this.#pki?.caCert;
  }

  // The identity an accepted token authenticates as.
  readonly user = serviceAccountUser(AGENT_SERVICE_ACCOUNT);

  // What the agent connects with: the fake's CA and an accepted token.
  connection(token = this.#firstToken()): KubeConnection {
    return new KubeConnection({ server: this.url, token, ...(this.#pki ? { ca: this.#pki.caCert } : {}) });
  }

  // Only these tokens authenticate from now on (a rotation: the old one
  // expires). Open watches stay open, as on a real API server.
  acceptTokens(...tokens: string[]): void {
    this.#tokens = new Set(tokens);
  }

  // A bearer token of this server for another service account (or the
  // agent's, beside the accepted ones): requests with it are recorded and,
  // with `rbac: 'applied'`, authorized as that account.
  serviceAccountToken(namespace: string, name: string): string {
    const token = `sa-${namespace}-${name}-${randomUUID()}`;
    this.#accountTokens.set(token, serviceAccountUser({ namespace, name }));
    return token;
  }

  setRbac(rbac: false | unknown[] | RbacPolicy | 'applied'): void {
    this.#rbac = toPolicy(rbac);
  }

  // A token TokenReview authenticates (it is not accepted as a bearer token
  // of this server): its user, audiences and extra, as a projected
  // service-account token bound to a pod would have them.
  // The user info extra a bearer token of this server authenticates with
  // (the agent's accepted tokens, serviceAccountToken()'s, adminTokens), as a
  // pod-bound projected token on 1.30+ carries
  // authentication.kubernetes.io/node-name; undefined or {}: none (a legacy
  // token, the default).
  setTokenExtra(token: string, extra: Record<string, string[]> | undefined): void {
    if (extra && Object.keys(extra).length > 0) this.#tokenExtra.set(token, structuredClone(extra));
    else this.#tokenExtra.delete(token);
  }

  // The ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding
  // objects among `objects` (true: manifests/admission-policy.yaml's),
  // stored as `kubectl apply` stores them.
  #storeAdmissionPolicies(objects: true | unknown[]): void {
    const all = objects === true ? loadManifestObjects(`${ROOT}manifests/admission-policy.yaml`) : objects;
    for (const o of all as Array<{ apiVersion?: string; kind?: string }>) {
      if (o?.kind !== 'ValidatingAdmissionPolicy' && o?.kind !== 'ValidatingAdmissionPolicyBinding') continue;
      const r = typeOfKind(o.apiVersion ?? '', o.kind);
      if (!r) throw new Error(`admissionPolicies: ${o.apiVersion} ${o.kind} is not served`);
      const created = this.objects.create(r, undefined, JSON.stringify(o));
      if (created.code !== 201) throw new Error(`admissionPolicies: ${JSON.stringify(created.body)}`);
    }
  }

  registerReviewToken(token: string, identity: ReviewedToken): void {
    this.#reviewTokens.set(token, identity);
  }

  forgetReviewToken(token: string): void {
    this.#reviewTokens.delete(token);
  }

  // A Pod GET answers (TokenReview's pod-bound tokens name one).
  setPod(namespace: string, name: string, uid: string, nodeName?: string): void {
    this.#pods.set(`${namespace}/${name}`, {
      metadata: { name, namespace, uid },
      spec: nodeName ? { nodeName } : {},
    });
  }

  // A VMI's launcher pod on a node, with the IPs the kubelet reports
  // (status.podIPs), as the list of a node's pods returns it.
  setLauncherPod(namespace: string, name: string, uid: string, nodeName: string, ips: string[], vmiUid: string): void {
    this.#pods.set(`${namespace}/${name}`, {
      metadata: { name, namespace, uid, ownerReferences: [{ kind: 'VirtualMachineInstance', uid: vmiUid }] },
      spec: { nodeName },
      status: { podIPs: ips.map((ip) => ({ ip })) },
    });
  }

  // Answer the next matching request(s) with this fault.
  fail(rule: FaultRule): void {
    this.#faults.push({ times: 1, ...rule });
  }

  // false: watches run past their timeoutSeconds (a server, or something
  // between, that never ends them); the client must notice and renew.
  honourWatchTimeouts(on: boolean): void {
    this.#honourWatchTimeout = on;
  }

  // What KubeVirt does on unpause besides clearing the Paused condition
  // (e.g. resume the libvirt domain); awaited before the 200, a throw is a 500.
  onUnpause(fn: (namespace: string, name: string) => void | Promise<void>): void {
    this.#onUnpause.push(fn);
  }

  // Runs right after the server ends a watch at its timeoutSeconds, before
  // the client can have watched again; given that watch's labelSelector.
  afterWatchTimeout(fn: (labelSelector: string) => void): void {
    this.#afterWatchTimeout.push(fn);
  }

  // Runs right after a request is answered (a watch: once it is open and
  // its first events are sent), before the client can have read the
  // answer: a change made here falls between two requests of the client.
  afterAnswer(fn: (request: RequestRecord) => void): void {
    this.#afterAnswer.push(fn);
  }

  #answered(request: RequestRecord): void {
    for (const fn of this.#afterAnswer) fn(request);
  }

  #firstToken(): string {
    return [...this.#tokens][0] ?? DEFAULT_TOKEN;
  }

  // A kubeconfig file for a subprocess (`--kubeconfig`); JSON is YAML.
  async writeKubeconfig(dir: string, token = this.#firstToken()): Promise<string> {
    const path = join(dir, 'kubeconfig.json');
    const config = {
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [
        {
          name: 'fake',
          cluster: {
            server: this.url,
            ...(this.#pki ? { 'certificate-authority-data': Buffer.from(this.#pki.caCert).toString('base64') } : {}),
          },
        },
      ],
      users: [{ name: 'agent', user: { token } }],
      contexts: [{ name: 'fake', context: { cluster: 'fake', user: 'agent' } }],
      'current-context': 'fake',
    };
    await writeFile(path, JSON.stringify(config));
    return path;
  }

  // ---- objects ----

  get resourceVersion(): string {
    return String(this.#rv);
  }

  getVmi(namespace: string, name: string): VmiObject | undefined {
    return this.#vmis.get(`${namespace}/${name}`);
  }

  // Create or replace; returns the stored object (with uid, resourceVersion).
  applyVmi(vmi: VmiObject): VmiObject {
    const key = `${vmi.metadata.namespace ?? 'default'}/${vmi.metadata.name}`;
    const prev = this.#vmis.get(key);
    const obj: VmiObject = structuredClone(vmi);
    obj.apiVersion = 'kubevirt.io/v1';
    obj.kind = 'VirtualMachineInstance';
    obj.metadata.namespace ??= 'default';
    obj.metadata.uid = prev?.metadata.uid ?? obj.metadata.uid ?? randomUUID();
    obj.metadata.creationTimestamp =
      prev?.metadata.creationTimestamp ??
      obj.metadata.creationTimestamp ??
      new Date().toISOString().replace(/\.\d+Z$/, 'Z');
    obj.metadata.resourceVersion = String(++this.#rv);
    this.#vmis.set(key, obj);
    this.#publish({ rv: this.#rv, type: prev ? 'MODIFIED' : 'ADDED', obj, ...(prev ? { prev } : {}) });
    return obj;
  }

  deleteVmi(namespace: string, name: string): boolean {
    const key = `${namespace}/${name}`;
    const prev = this.#vmis.get(key);
    if (!prev) return false;
    this.#vmis.delete(key);
    const obj = structuredClone(prev);
    obj.metadata.resourceVersion = String(++this.#rv);
    this.#publish({ rv: this.#rv, type: 'DELETED', obj, prev });
    return true;
  }

  // Change objects without telling any watch (what a watch misses while it
  // is down, before a 410).
  deleteVmiSilently(namespace: string, name: string): void {
    this.#vmis.delete(`${namespace}/${name}`);
    this.#rv++;
  }

  getSecret(namespace: string, name: string): SecretObject | undefined {
    return this.#secrets.get(`${namespace}/${name}`);
  }

  setSecret(secret: SecretObject): void {
    const s = this.#storeSecret(secret);
    this.#publishObject('secrets', s, this.#lastPrev);
  }

  #lastPrev: SecretObject | ConfigMapObject | undefined;

  #storeSecret(secret: SecretObject): SecretObject {
    const s = structuredClone(secret);
    s.metadata.namespace ??= 'default';
    if (s.stringData) {
      s.data = { ...(s.data ?? {}) };
      for (const [k, v] of Object.entries(s.stringData)) s.data[k] = Buffer.from(v).toString('base64');
      delete s.stringData;
    }
    s.metadata.resourceVersion = String(++this.#rv);
    const key = `${s.metadata.namespace}/${s.metadata.name}`;
    this.#lastPrev = this.#secrets.get(key);
    this.#secrets.set(key, s);
    return s;
  }

  deleteSecret(namespace: string, name: string): void {
    this.#deleteObject('secrets', namespace, name);
  }

  getConfigMap(namespace: string, name: string): ConfigMapObject | undefined {
    return this.#configMaps.get(`${namespace}/${name}`);
  }

  setConfigMap(cm: ConfigMapObject): void {
    const c = structuredClone(cm);
    c.metadata.namespace ??= 'default';
    c.metadata.resourceVersion = String(++this.#rv);
    const key = `${c.metadata.namespace}/${c.metadata.name}`;
    const prev = this.#configMaps.get(key);
    this.#configMaps.set(key, c);
    this.#publishObject('configmaps', c, prev);
  }

  deleteConfigMap(namespace: string, name: string): void {
    this.#deleteObject('configmaps', namespace, name);
  }

  // Change a Secret without telling any watch (what a watch misses while it
  // is down, before a 410).
  setSecretSilently(secret: SecretObject): void {
    this.#storeSecret(secret);
  }

  #deleteObject(resource: ObjectResource, namespace: string, name: string): void {
    const store = resource === 'secrets' ? this.#secrets : this.#configMaps;
    const prev = store.get(`${namespace}/${name}`);
    if (!prev) return;
    store.delete(`${namespace}/${name}`);
    const obj = structuredClone(prev);
    obj.metadata.resourceVersion = String(++this.#rv);
    this.#publishEntry({ rv: this.#rv, type: 'DELETED', obj: obj as unknown as VmiObject, resource });
  }

  #publishObject(resource: ObjectResource, obj: SecretObject | ConfigMapObject, prev: unknown): void {
    this.#publishEntry({
      rv: Number(obj.metadata.resourceVersion),
      type: prev ? 'MODIFIED' : 'ADDED',
      obj: structuredClone(obj) as unknown as VmiObject,
      resource,
    });
  }

  #publishEntry(entry: HistoryEntry): void {
    this.#history.push(entry);
    while (this.#history.length > this.#historyLimit) this.#compactedRv = this.#history.shift()!.rv;
    for (const w of this.#watchers) this.#deliver(w, entry);
  }

  // Open watches of one name on Secrets or ConfigMaps.
  objectWatchCount(): number {
    return [...this.#watchers].filter((w) => w.resource !== undefined).length;
  }

  // Bytes written to watch streams that the client has not taken yet and
  // that are still held in this process (beyond what the kernel buffers).
  watchBacklogBytes(): number {
    let n = 0;
    for (const w of this.#watchers) n += w.res.writableLength + (w.res.socket?.writableLength ?? 0);
    return n;
  }

  events(): StoredEvent[] {
    return [...this.#events.values()];
  }

  // ---- faults ----

  // Every open watch stops receiving (the connection stays open, silent).
  stallWatches(alsoNew = false): void {
    for (const w of this.#watchers) w.stalled = true;
    this.#stallNew = alsoNew;
  }

  unstall(): void {
    this.#stallNew = false;
  }

  // Cut every open watch connection (socket destroyed mid-stream).
  dropWatches(): void {
    for (const w of this.#watchers) w.res.socket?.destroy();
    this.#watchers.clear();
  }

  // Forget history: resuming from an older resourceVersion gets 410 Gone,
  // as an HTTP status ('status') or as an ERROR event on a 200 ('event').
  // Open watches are closed (in 'event' mode after an ERROR 410 event).
  expire(mode: 'status' | 'event' = 'event'): void {
    this.#goneMode = mode;
    this.#compactedRv = ++this.#rv;
    this.#history = [];
    for (const w of this.#watchers) {
      if (mode === 'event')
        this.#send(w, { type: 'ERROR', object: status(410, 'Expired', 'too old resource version') });
      w.res.end();
    }
    this.#watchers.clear();
  }

  bookmark(): void {
    for (const w of this.#watchers) {
      if (w.bookmarks) {
        this.#send(w, {
          type: 'BOOKMARK',
          object: {
            kind: 'VirtualMachineInstance',
            apiVersion: 'kubevirt.io/v1',
            metadata: { resourceVersion: String(this.#rv) },
          },
        });
      }
    }
  }

  // Close the port: connections are refused until refuse(false).
  async refuse(on: boolean): Promise<void> {
    if (on === this.#refusing) return;
    this.#refusing = on;
    if (on) {
      const closed = new Promise<void>((r) => this.#server.close(() => r()));
      for (const s of this.#sockets) s.destroy();
      this.#watchers.clear();
      await closed;
    } else {
      await this.#listen(this.#port);
    }
  }

  async close(): Promise<void> {
    if (this.#bookmarkTimer) clearInterval(this.#bookmarkTimer);
    for (const s of this.#sockets) s.destroy();
    this.#watchers.clear();
    if (!this.#refusing) await new Promise<void>((r) => this.#server.close(() => r()));
  }

  // TCP connections open to it (an HTTP/2 connection carries many requests).
  connectionCount(): number {
    return this.#sockets.size;
  }

  // Open VMI watches.
  watchCount(): number {
    return [...this.#watchers].filter((w) => w.resource === undefined).length;
  }

  // ---- protocol ----

  #publish(entry: HistoryEntry): void {
    this.#publishEntry(entry);
  }

  #deliver(w: Watcher, e: HistoryEntry): void {
    if (w.resource !== e.resource) return;
    if (w.namespace !== undefined && e.obj.metadata.namespace !== w.namespace) return;
    if (w.resource !== undefined) {
      if (w.name === undefined || e.obj.metadata.name === w.name) this.#send(w, { type: e.type, object: e.obj });
      return;
    }
    const now = e.type !== 'DELETED' && w.selector(e.obj.metadata.labels);
    const before = e.prev !== undefined && w.selector(e.prev.metadata.labels);
    let type: string | undefined;
    if (now && before) type = 'MODIFIED';
    else if (now) type = 'ADDED';
    else if (before) type = 'DELETED';
    if (type) this.#send(w, { type, object: e.obj });
  }

  #send(w: Watcher, event: unknown): void {
    if (w.stalled || w.res.writableEnded || w.res.destroyed) return;
    w.res.write(JSON.stringify(event) + '\n');
  }

  // A watch of Secrets or ConfigMaps in one namespace, usually of one name
  // (fieldSelector=metadata.name=<name>): the same stream rules as the VMI
  // watch (resourceVersion, 410, timeoutSeconds, bookmarks).
  #watchObjects(
    req: IncomingMessage,
    res: ServerResponse,
    url: URL,
    resource: ObjectResource,
    namespace: string,
    reply: (code: number, body: unknown) => void,
    verb: Verb,
    p: ReturnType<typeof parsePath>,
  ): void {
    const name = nameSelector(url.searchParams.get('fieldSelector'));
    if (name === null) return reply(400, status(400, 'BadRequest', 'unsupported fieldSelector'));
    const from = url.searchParams.get('resourceVersion') ?? '';
    const fromRv = from === '' || from === '0' ? undefined : Number(from);
    if (fromRv !== undefined && fromRv < this.#compactedRv && this.#goneMode === 'status')
      return reply(410, status(410, 'Expired', `too old resource version: ${from} (${this.#compactedRv})`));
    const record = this.#record(req, url, 200, verb, p);
    res.writeHead(200, { 'content-type': 'application/json', ...chunked(req) });
    res.flushHeaders();
    const w: Watcher = {
      res,
      resource,
      ...(name !== undefined ? { name } : {}),
      namespace,
      selector: () => true,
      bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true',
      stalled: this.#stallNew,
    };
    if (fromRv !== undefined && fromRv < this.#compactedRv) {
      this.#send(w, { type: 'ERROR', object: status(410, 'Expired', `too old resource version: ${from}`) });
      res.end();
      return;
    }
    if (fromRv === undefined) {
      const store = resource === 'secrets' ? this.#secrets : this.#configMaps;
      for (const o of store.values())
        if (o.metadata.namespace === namespace && (name === undefined || o.metadata.name === name))
          this.#send(w, { type: 'ADDED', object: o });
    } else {
      for (const e of this.#history) if (e.rv > fromRv) this.#deliver(w, e);
    }
    this.#open(w, url, { kind: resource === 'secrets' ? 'Secret' : 'ConfigMap', apiVersion: 'v1' });
    this.#answered(record);
  }

  // An open watch: timeoutSeconds ends it cleanly, after the bookmark the
  // API server's watch cache sends as a watch nears its deadline (so the
  // client resumes from a current resourceVersion).
  #open(w: Watcher, url: URL, kind: { kind: string; apiVersion: string }, afterTimeout = () => {}): void {
    this.#watchers.add(w);
    const timeoutSeconds = Number(url.searchParams.get('timeoutSeconds') ?? '');
    if (this.#honourWatchTimeout && timeoutSeconds > 0) {
      w.timer = setTimeout(
        () => {
          if (w.bookmarks)
            this.#send(w, { type: 'BOOKMARK', object: { ...kind, metadata: { resourceVersion: String(this.#rv) } } });
          this.#watchers.delete(w);
          w.res.end();
          afterTimeout();
        },
        timeoutSeconds * 1000 * this.#watchTimeScale,
      );
    }
    w.res.on('close', () => {
      if (w.timer) clearTimeout(w.timer);
      this.#watchers.delete(w);
    });
  }

  // The user a request's bearer token authenticates as, if any.
  // The user info admission sees for a request (authenticated): the user,
  // the groups the API server gives it, and its token's extra.
  #userInfo(req: IncomingMessage, username: string): UserInfo {
    const token = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
    const sa = /^system:serviceaccount:([^:]+):/.exec(username);
    const groups = sa
      ? ['system:serviceaccounts', `system:serviceaccounts:${sa[1]}`, 'system:authenticated']
      : username === ADMIN_USER
        ? ['kubeadm:cluster-admins', 'system:authenticated']
        : ['system:authenticated'];
    const extra = this.#tokenExtra.get(token);
    return { username, groups, ...(extra ? { extra: structuredClone(extra) } : {}) };
  }

  // The ValidatingAdmissionPolicy plugin over the policies and bindings
  // stored on this server: the refusal, or undefined (admitted; always so
  // while none is stored).
  #admitByPolicies(a: AdmissionAttributes): { code: number; body: unknown } | undefined {
    const stored = this.objects.all();
    const policies = stored.filter((o) => o.kind === 'ValidatingAdmissionPolicy') as unknown as AdmissionPolicy[];
    if (policies.length === 0) return undefined;
    const bindings = stored.filter(
      (o) => o.kind === 'ValidatingAdmissionPolicyBinding',
    ) as unknown as AdmissionPolicyBinding[];
    const refused = admitByPolicies(policies, bindings, a);
    return refused ? { code: refused.code, body: refused.status } : undefined;
  }

  #authenticate(req: IncomingMessage): string | undefined {
    const m = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '');
    if (m === null) return undefined;
    if (this.#adminTokens.has(m[1])) return ADMIN_USER;
    return this.#tokens.has(m[1]) ? this.user : this.#accountTokens.get(m[1]);
  }

  #allows(attrs: RequestAttributes, user = this.user): boolean {
    if (this.#rbac === undefined) return true;
    // Another service account (the cluster component's): what the
    // manifests grant that account, whatever policy the agent is given.
    if (this.#rbac !== 'applied' && user !== this.user) return allows(manifestPolicyOf(user), attrs);
    if (this.#rbac !== 'applied') return allows(this.#rbac, attrs);
    const [namespace, name] = user.replace(/^system:serviceaccount:/, '').split(':');
    const objects = this.objects.all().filter((o) => RBAC_KINDS.has(o.kind));
    return allows(rbacFromManifests(objects, { namespace, name }), attrs);
  }

  #takeFault(req: IncomingMessage, url: URL, verb: Verb, statuses: (s: number) => boolean): FaultRule | undefined {
    const i = this.#faults.findIndex(
      (f) =>
        statuses(f.status) &&
        (f.method === undefined || f.method === req.method) &&
        (f.verb === undefined || f.verb === verb) &&
        (f.path === undefined || f.path.test(url.pathname)) &&
        (f.labelSelector === undefined || f.labelSelector === url.searchParams.get('labelSelector')),
    );
    if (i < 0) return undefined;
    const f = this.#faults[i];
    if (--f.times! <= 0) this.#faults.splice(i, 1);
    return f;
  }

  #record(
    req: IncomingMessage,
    url: URL,
    status: number,
    verb: Verb,
    parsed: ReturnType<typeof parsePath>,
  ): RequestRecord {
    const record: RequestRecord = {
      user: this.#authenticate(req) ?? 'system:anonymous',
      method: req.method ?? '',
      path: url.pathname,
      verb,
      group: parsed.group,
      resource: parsed.resource,
      ...(parsed.subresource ? { subresource: parsed.subresource } : {}),
      ...(parsed.namespace ? { namespace: parsed.namespace } : {}),
      ...(parsed.name ? { name: parsed.name } : {}),
      query: Object.fromEntries(url.searchParams),
      status,
      httpVersion: req.httpVersion,
      at: Date.now(),
    };
    this.requests.push(record);
    return record;
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x');
    const p = parsePath(url.pathname);
    const watch = url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1';
    const verb: Verb =
      req.method === 'GET'
        ? p.name
          ? 'get'
          : watch
            ? 'watch'
            : 'list'
        : req.method === 'POST'
          ? 'create'
          : req.method === 'PATCH'
            ? 'patch'
            : req.method === 'PUT'
              ? 'update'
              : req.method === 'DELETE'
                ? 'delete'
                : 'unknown';
    const reply = (code: number, body: unknown, headers: Record<string, string> = {}) => {
      const record = this.#record(req, url, code, verb, p);
      res.writeHead(code, { 'content-type': 'application/json', ...headers });
      res.end(JSON.stringify(body));
      this.#answered(record);
    };
    const body = await readBody(req);

    // The API server's filter chain: authentication, priority and fairness
    // (429), authorization (403), then the handler.
    const user = this.#authenticate(req);
    if (user === undefined) return reply(401, status(401, 'Unauthorized', 'Unauthorized'));
    const served = req.method === 'GET' ? discovery(url.pathname) : undefined;
    if (served !== undefined) return reply(200, served);
    const fault429 = this.#takeFault(req, url, verb, (s) => s === 429);
    if (fault429) {
      const after = fault429.retryAfterSeconds ?? 1;
      return reply(
        429,
        status(429, 'TooManyRequests', 'Too many requests, please try again later.', { retryAfterSeconds: after }),
        { 'retry-after': String(after) },
      );
    }
    let attrs: RequestAttributes | undefined;
    try {
      attrs = requestAttributes({ method: req.method ?? 'GET', path: req.url ?? '/' });
    } catch {
      attrs = undefined; // not a resource request: 404 below
    }
    if (attrs && user !== ADMIN_USER && !this.#allows(attrs, user)) return reply(403, forbiddenStatus(user, attrs));
    const fault5xx = this.#takeFault(req, url, verb, (s) => s >= 500);
    if (fault5xx) {
      const reason =
        fault5xx.status === 503 ? 'ServiceUnavailable' : fault5xx.status === 504 ? 'Timeout' : 'InternalError';
      return reply(
        fault5xx.status,
        status(fault5xx.status, reason, `fault injected by the test (${fault5xx.status})`),
        fault5xx.retryAfterSeconds !== undefined ? { 'retry-after': String(fault5xx.retryAfterSeconds) } : {},
      );
    }

    if (url.pathname === '/apis/authentication.k8s.io/v1/tokenreviews' && req.method === 'POST')
      return reply(201, this.#tokenReview(body));
    if (p.group === '' && p.resource === 'pods' && p.namespace && p.name && req.method === 'GET') {
      const pod = this.#pods.get(`${p.namespace}/${p.name}`);
      return pod
        ? reply(200, pod)
        : reply(404, status(404, 'NotFound', `pods "${p.name}" not found`, { name: p.name, kind: 'pods' }));
    }
    // A node's pods (fieldSelector=spec.nodeName=<node>, what the agent
    // watches its launcher pods with): the list, and a watch that stays
    // open and silent (setPod tells no watch).
    if (p.group === '' && p.resource === 'pods' && !p.name && req.method === 'GET') {
      const node = /^spec\.nodeName=(.+)$/.exec(url.searchParams.get('fieldSelector') ?? '')?.[1];
      if (node === undefined) return reply(400, status(400, 'BadRequest', 'unsupported fieldSelector'));
      if (!watch) {
        const items = [...this.#pods.values()].filter(
          (x) => x.spec.nodeName === node && (!p.namespace || x.metadata.namespace === p.namespace),
        );
        return reply(200, {
          apiVersion: 'v1',
          kind: 'PodList',
          metadata: { resourceVersion: String(this.#rv) },
          items,
        });
      }
      this.#record(req, url, 200, verb, p);
      res.writeHead(200, { 'content-type': 'application/json', ...chunked(req) });
      res.flushHeaders();
      return;
    }

    const vmiNamespace =
      url.pathname === VMI_PATH
        ? null
        : /^\/apis\/kubevirt\.io\/v1\/namespaces\/([^/]+)\/virtualmachineinstances$/.exec(url.pathname)?.[1];
    if (vmiNamespace !== undefined && req.method === 'GET') {
      const ns = vmiNamespace === null ? undefined : decodeURIComponent(vmiNamespace);
      const labelSelector = parseSelector(url.searchParams.get('labelSelector') ?? undefined);
      const selector: Selector = labelSelector;
      const inScope = (v: VmiObject) => ns === undefined || v.metadata.namespace === ns;
      if (!watch) {
        const items = [...this.#vmis.values()].filter((v) => inScope(v) && selector(v.metadata.labels));
        return reply(200, {
          apiVersion: 'kubevirt.io/v1',
          kind: 'VirtualMachineInstanceList',
          metadata: { resourceVersion: String(this.#rv) },
          items,
        });
      }
      const from = url.searchParams.get('resourceVersion') ?? '';
      const fromRv = from === '' || from === '0' ? undefined : Number(from);
      if (fromRv !== undefined && fromRv < this.#compactedRv && this.#goneMode === 'status') {
        return reply(410, status(410, 'Expired', `too old resource version: ${from} (${this.#compactedRv})`));
      }
      this.#record(req, url, 200, verb, p);
      res.writeHead(200, { 'content-type': 'application/json', ...chunked(req) });
      res.flushHeaders();
      const w: Watcher = {
        res,
        selector,
        ...(ns !== undefined ? { namespace: ns } : {}),
        bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true',
        stalled: this.#stallNew,
      };
      if (fromRv !== undefined && fromRv < this.#compactedRv) {
        this.#send(w, {
          type: 'ERROR',
          object: status(410, 'Expired', `too old resource version: ${from} (${this.#compactedRv})`),
        });
        res.end();
        return;
      }
      if (fromRv === undefined) {
        for (const v of this.#vmis.values())
          if (inScope(v) && selector(v.metadata.labels)) this.#send(w, { type: 'ADDED', object: v });
      } else {
        for (const e of this.#history) if (e.rv > fromRv) this.#deliver(w, e);
      }
      // Changes made after its timeout reach no open watch: the client must resume from its resourceVersion.
      this.#open(w, url, { kind: 'VirtualMachineInstance', apiVersion: 'kubevirt.io/v1' }, () => {
        for (const fn of this.#afterWatchTimeout) fn(url.searchParams.get('labelSelector') ?? '');
      });
      return;
    }

    if (
      p.group === '' &&
      (p.resource === 'secrets' || p.resource === 'configmaps') &&
      req.method === 'GET' &&
      p.namespace &&
      !p.name &&
      watch
    ) {
      return this.#watchObjects(req, res, url, p.resource, p.namespace, reply, verb, p);
    }

    if (
      p.group === '' &&
      (p.resource === 'secrets' || p.resource === 'configmaps') &&
      req.method === 'GET' &&
      p.namespace &&
      p.name
    ) {
      const store = p.resource === 'secrets' ? this.#secrets : this.#configMaps;
      const obj = store.get(`${p.namespace}/${p.name}`);
      if (!obj)
        return reply(
          404,
          status(404, 'NotFound', `${p.resource} "${p.name}" not found`, { name: p.name, kind: p.resource }),
        );
      return reply(200, obj);
    }

    if (
      p.group === 'subresources.kubevirt.io' &&
      p.resource === 'virtualmachineinstances' &&
      p.subresource === 'unpause' &&
      p.namespace &&
      p.name
    ) {
      if (req.method !== 'PUT')
        return reply(
          405,
          status(405, 'MethodNotAllowed', `the server does not allow this method on the requested resource`),
        );
      const vmi = this.#vmis.get(`${p.namespace}/${p.name}`);
      if (!vmi)
        return reply(
          404,
          status(404, 'NotFound', `virtualmachineinstance.kubevirt.io "${p.name}" not found`, {
            name: p.name,
            group: 'kubevirt.io',
            kind: 'virtualmachineinstance',
          }),
        );
      const conflict = (why: string) =>
        reply(
          409,
          status(
            409,
            'Conflict',
            `Operation cannot be fulfilled on virtualmachineinstance.kubevirt.io "${p.name}": ${why}`,
            { name: p.name, group: 'kubevirt.io', kind: 'virtualmachineinstance' },
          ),
        );
      if (vmi.status?.phase !== 'Running') return conflict('VMI is not running');
      const conditions = (vmi.status.conditions ?? []) as Array<{ type: string; status: string }>;
      if (!conditions.some((c) => c.type === 'Paused' && c.status === 'True')) return conflict('VMI is not paused');
      // virt-api answers once virt-handler had the launcher resume the domain.
      for (const fn of this.#onUnpause) {
        try {
          await fn(p.namespace, p.name);
        } catch (e) {
          return reply(500, status(500, 'InternalError', `Internal error occurred: ${(e as Error).message}`));
        }
      }
      const next = structuredClone(this.#vmis.get(`${p.namespace}/${p.name}`) ?? vmi);
      next.status!.conditions = ((next.status!.conditions ?? []) as Array<{ type: string }>).filter(
        (c) => c.type !== 'Paused',
      );
      this.applyVmi(next);
      this.unpaused.push(`${p.namespace}/${p.name}`);
      this.#record(req, url, 200, verb, p);
      res.writeHead(200);
      res.end();
      return;
    }

    const vmiItem = /^\/apis\/kubevirt\.io\/v1\/namespaces\/([^/]+)\/virtualmachineinstances\/([^/]+)$/.exec(
      url.pathname,
    );
    if (vmiItem && req.method === 'PATCH') {
      const [ns, name] = [decodeURIComponent(vmiItem[1]), decodeURIComponent(vmiItem[2])];
      const stored = this.#vmis.get(`${ns}/${name}`);
      const contentType = req.headers['content-type'] ?? '';
      // The API server's order: the patch applied and the object validated
      // (415, 400, 404, 409, 422 from patchVmi without KubeVirt's webhook),
      // then the ValidatingAdmissionPolicies (an UPDATE), then KubeVirt's
      // validating webhook.
      const validated = patchVmi(stored, name, contentType, body, true);
      if (validated.ok && stored) {
        const refused = this.#admitByPolicies({
          resource: { group: 'kubevirt.io', version: 'v1', resource: 'virtualmachineinstances' },
          kind: { group: 'kubevirt.io', version: 'v1', kind: 'VirtualMachineInstance' },
          name,
          namespace: ns,
          operation: 'UPDATE',
          userInfo: this.#userInfo(req, user),
          object: validated.object,
          oldObject: stored,
          namespaceObject: this.objects.get(resourceType('', 'namespaces')!, undefined, ns) ?? {
            apiVersion: 'v1',
            kind: 'Namespace',
            metadata: { name: ns, labels: { 'kubernetes.io/metadata.name': ns } },
          },
          // A patch is admitted with UpdateOptions (patchToUpdateOptions).
          options: { apiVersion: 'meta.k8s.io/v1', kind: 'UpdateOptions' },
          uid: randomUUID(),
        });
        if (refused) return reply(refused.code, refused.body);
      }
      const answer = patchVmi(stored, name, contentType, body);
      return answer.ok ? reply(200, this.applyVmi(answer.object)) : reply(answer.code, answer.body);
    }

    if (p.group === '' && p.resource === 'events' && p.namespace) {
      if (req.method === 'POST' && !p.name) {
        const ev = JSON.parse(body) as StoredEvent;
        const key = `${p.namespace}/${ev.metadata?.name}`;
        if (!ev.metadata?.name) return reply(422, status(422, 'Invalid', 'metadata.name: Required value'));
        if (this.#events.has(key))
          return reply(409, status(409, 'AlreadyExists', `events "${ev.metadata.name}" already exists`));
        ev.metadata.namespace = p.namespace;
        ev.metadata.uid = randomUUID();
        ev.metadata.resourceVersion = String(++this.#rv);
        this.#events.set(key, ev);
        return reply(201, ev);
      }
      if (req.method === 'PATCH' && p.name) {
        const ct = req.headers['content-type'] ?? '';
        if (!/merge-patch\+json|strategic-merge-patch\+json/.test(ct))
          return reply(
            415,
            status(415, 'UnsupportedMediaType', `the body of the request was in an unknown format: ${ct}`),
          );
        const ev = this.#events.get(`${p.namespace}/${p.name}`);
        if (!ev)
          return reply(404, status(404, 'NotFound', `events "${p.name}" not found`, { name: p.name, kind: 'events' }));
        Object.assign(ev, JSON.parse(body));
        ev.metadata.resourceVersion = String(++this.#rv);
        return reply(200, ev);
      }
    }
    const created = this.#createObject(req, p, body);
    if (created) return reply(created.code, created.body);
    return reply(404, status(404, 'NotFound', 'the server could not find the requested resource'));
  }

  // The API server's TokenReview: authenticated when the token is registered
  // and valid for one of the audiences asked (status.audiences: those).
  #tokenReview(body: string): unknown {
    let spec: { token?: string; audiences?: string[] } = {};
    try {
      spec = (JSON.parse(body) as { spec?: typeof spec }).spec ?? {};
    } catch {
      // an empty spec: not authenticated
    }
    const known = spec.token === undefined ? undefined : this.#reviewTokens.get(spec.token);
    const asked = spec.audiences ?? [];
    const audiences = known ? known.audiences.filter((a) => asked.length === 0 || asked.includes(a)) : [];
    const review = { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', metadata: {}, spec };
    if (!known || audiences.length === 0)
      return {
        ...review,
        status: {
          authenticated: false,
          error: known ? 'token audiences is invalid for the target audiences' : 'invalid bearer token',
        },
      };
    return {
      ...review,
      status: {
        authenticated: true,
        audiences,
        user: {
          username: known.username,
          uid: randomUUID(),
          groups: ['system:serviceaccounts', 'system:authenticated'],
          extra: known.extra ?? {},
        },
      },
    };
  }

  // kubectl's create, get and server-side apply of the install's objects;
  // a Secret or ConfigMap created goes where the agent's reads find it.
  #createObject(req: IncomingMessage, p: ReturnType<typeof parsePath>, body: string): ObjectReply | undefined {
    const r = resourceType(p.group, p.resource);
    if (!r || p.subresource || r.resource === 'events' || r.resource === 'virtualmachineinstances') return undefined;
    if (r.namespaced !== (p.namespace !== undefined)) return undefined;
    if (r.resource === 'secrets' || r.resource === 'configmaps') {
      const store: Map<string, SecretObject | ConfigMapObject> =
        r.resource === 'secrets' ? this.#secrets : this.#configMaps;
      if (req.method === 'PUT' && p.name) return this.#updateObject(r, store, p.namespace, p.name, body);
      if (req.method !== 'POST' || p.name) return undefined;
      const a = this.objects.admit(r, p.namespace, body, (name) => store.has(`${p.namespace}/${name}`));
      if ('refused' in a) return a.refused;
      const obj = a.object;
      if (r.resource === 'secrets') this.setSecret(obj as unknown as SecretObject);
      else this.setConfigMap(obj as unknown as ConfigMapObject);
      return { code: 201, body: store.get(`${p.namespace}/${obj.metadata.name}`) };
    }
    if (req.method === 'POST' && !p.name) return this.objects.create(r, p.namespace, body);
    if (req.method === 'GET' && p.name) return this.objects.read(r, p.namespace, p.name);
    const ct = req.headers['content-type'] ?? '';
    if (req.method === 'PATCH' && p.name && ct.startsWith('application/apply-patch'))
      return this.objects.apply(r, p.namespace, p.name, body);
    return undefined;
  }

  // PUT of a Secret or ConfigMap, as the API server's update: the object
  // must exist (no create on update for these kinds), the body's name is the
  // URL's, and a resourceVersion in the body makes it conditional: any other
  // than the stored one is a 409 Conflict. Watches see it MODIFIED.
  #updateObject(
    r: ResourceType,
    store: Map<string, SecretObject | ConfigMapObject>,
    namespace: string | undefined,
    name: string,
    body: string,
  ): ObjectReply {
    // Its own checks, not admit()'s: a Secret set by a test may live in a
    // namespace the install's objects never created.
    let obj: SecretObject | ConfigMapObject;
    try {
      obj = JSON.parse(body) as SecretObject | ConfigMapObject;
    } catch {
      return { code: 400, body: status(400, 'BadRequest', 'the request body is not JSON') };
    }
    if (obj?.apiVersion !== 'v1' || obj.kind !== r.kind || typeof obj.metadata?.name !== 'string')
      return { code: 400, body: status(400, 'BadRequest', `the body is not a v1 ${r.kind} with a name`) };
    if (obj.metadata.namespace !== undefined && obj.metadata.namespace !== namespace)
      return {
        code: 400,
        body: status(
          400,
          'BadRequest',
          'the namespace of the provided object does not match the namespace sent on the request',
        ),
      };
    obj.metadata.namespace = namespace;
    if (obj.metadata.name !== name)
      return {
        code: 400,
        body: status(
          400,
          'BadRequest',
          `the name of the object (${obj.metadata.name}) does not match the name on the URL (${name})`,
        ),
      };
    const prev = store.get(`${namespace}/${name}`);
    if (!prev)
      return {
        code: 404,
        body: status(404, 'NotFound', `${r.resource} "${name}" not found`, { name, kind: r.resource }),
      };
    const rv = obj.metadata.resourceVersion;
    if (rv !== undefined && rv !== '' && rv !== prev.metadata.resourceVersion)
      return {
        code: 409,
        body: status(
          409,
          'Conflict',
          `Operation cannot be fulfilled on ${r.resource} "${name}": the object has been modified; please apply your changes to the latest version and try again`,
          { name, kind: r.resource },
        ),
      };
    if (r.resource === 'secrets') this.setSecret(obj as SecretObject);
    else this.setConfigMap(obj as ConfigMapObject);
    return { code: 200, body: store.get(`${namespace}/${name}`) };
  }
}

// HTTP/1.1 streams a watch in chunks; HTTP/2 forbids the header (its frames
// delimit the body).
function chunked(req: IncomingMessage): Record<string, string> {
  return req.httpVersionMajor === 1 ? { 'transfer-encoding': 'chunked' } : {};
}

// metadata.name=<name> (or ==), the one field selector the agent sends.
function nameSelector(text: string | null): string | undefined | null {
  if (text === null || text === '') return undefined;
  const m = /^metadata\.name==?(.*)$/.exec(text);
  return m ? m[1] : null;
}

function parsePath(path: string): {
  group: string;
  resource: string;
  subresource?: string;
  namespace?: string;
  name?: string;
} {
  const parts = path.split('/').filter(Boolean);
  let rest: string[];
  let group = '';
  if (parts[0] === 'api') rest = parts.slice(2);
  else if (parts[0] === 'apis') {
    group = parts[1] ?? '';
    rest = parts.slice(3);
  } else return { group: '?', resource: path };
  let namespace: string | undefined;
  if (rest[0] === 'namespaces' && rest.length >= 3) {
    namespace = rest[1];
    rest = rest.slice(2);
  }
  return {
    group,
    resource: rest[0] ?? '',
    ...(namespace ? { namespace } : {}),
    ...(rest[1] ? { name: rest[1] } : {}),
    ...(rest[2] ? { subresource: rest[2] } : {}),
  };
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  try {
    return jsonBody(Buffer.concat(chunks));
  } catch (e) {
    return `(undecodable: ${(e as Error).message})`; // not JSON: 400 BadRequest where a body is read
  }
}

let defaultPolicy: RbacPolicy | undefined;
const accountPolicies = new Map<string, RbacPolicy>();

// What manifests/ (the node agents and the cluster component) grant one
// service account's user.
function manifestPolicyOf(user: string): RbacPolicy {
  let policy = accountPolicies.get(user);
  if (!policy) {
    const [namespace, name] = user.replace(/^system:serviceaccount:/, '').split(':');
    policy = rbacFromManifests(
      [
        ...loadManifestObjects(`${ROOT}manifests/daemonset.yaml`),
        ...loadManifestObjects(`${ROOT}manifests/cluster.yaml`),
      ],
      { namespace, name },
    );
    accountPolicies.set(user, policy);
  }
  return policy;
}

// Without `rbac`, the agent holds what it holds when it reads and unpauses
// itself (the single-tenant variant: the base's ClusterRole and the
// direct-reads component's), which is how most tests run it; tests of the
// split deployment pass the rendered variant's objects.
function toPolicy(rbac: false | unknown[] | RbacPolicy | 'applied' | undefined): RbacPolicy | 'applied' | undefined {
  if (rbac === false || rbac === 'applied') return rbac === 'applied' ? rbac : undefined;
  if (rbac === undefined)
    return (defaultPolicy ??= rbacFromManifests([
      ...loadManifestObjects(`${ROOT}manifests/daemonset.yaml`),
      ...loadManifestObjects(`${ROOT}deploy/components/direct-reads/clusterrole.yaml`),
    ]));
  return Array.isArray(rbac) ? rbacFromManifests(rbac) : rbac;
}
