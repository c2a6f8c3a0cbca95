// A fake Kubernetes API server on loopback that speaks the real protocol as
// @kubernetes/client-node 2.x uses it: VMI list (resourceVersion, label
// selector) and watch (chunked JSON lines, allowWatchBookmarks/BOOKMARK,
// 410 Gone as an HTTP status or an ERROR event), Secret/ConfigMap GET with
// 404 Status, Event POST/PATCH, and KubeVirt's VMI `unpause` subresource
// (PUT on subresources.kubevirt.io, answered like virt-api: 200, 404, 409
// "VMI is not running" / "VMI is not paused"). Faults on demand: dropped connections,
// stalled watches, refused connections. Every request is logged (method,
// path, verb, resource) so tests can check RBAC covers exactly what is used.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { KubeConnection } from '../../src/agent/kube-connection.ts';
import type { ConfigMapObject, SecretObject, VmiObject } from '../../src/cloudinit/kube-types.ts';

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
}

interface Watcher {
  res: ServerResponse;
  selector: Selector;
  bookmarks: boolean;
  stalled: boolean;
}

type Selector = (labels: Record<string, string> | undefined) => boolean;

const VMI_PATH = '/apis/kubevirt.io/v1/virtualmachineinstances';

function parseSelector(text: string | undefined): Selector {
  if (!text) return () => true;
  const reqs = text.split(',').map((part) => {
    const ne = part.split('!=');
    if (ne.length === 2) return { key: ne[0]!.trim(), value: ne[1]!.trim(), equal: false };
    const eq = part.split(/==?/);
    return { key: eq[0]!.trim(), value: (eq[1] ?? '').trim(), equal: true };
  });
  return (labels) => reqs.every((r) => ((labels ?? {})[r.key] === r.value) === r.equal);
}

function status(code: number, reason: string, message: string, details?: Record<string, unknown>) {
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code, ...(details ? { details } : {}) };
}

export interface FakeKubeOptions {
  // Send a BOOKMARK to bookmark-enabled watches this often.
  bookmarkIntervalMs?: number;
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

  private constructor() {
    this.#server = createServer((req, res) => this.#handle(req, res));
    this.#server.on('connection', (s: Socket) => {
      this.#sockets.add(s);
      s.on('close', () => this.#sockets.delete(s));
    });
  }

  static async start(options: FakeKubeOptions = {}): Promise<FakeKube> {
    const f = new FakeKube();
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
      this.#server.listen(port, '127.0.0.1', () => {
        this.#server.off('error', reject);
        resolve();
      });
    });
    this.#port = (this.#server.address() as { port: number }).port;
  }

  get url(): string {
    return `http://127.0.0.1:${this.#port}`;
  }

  // What the agent connects with (plain http on loopback).
  connection(): KubeConnection {
    return new KubeConnection({ server: this.url, token: 'fake-token' });
  }

  // A kubeconfig file for a subprocess (`--kubeconfig`); JSON is YAML.
  async writeKubeconfig(dir: string): Promise<string> {
    const path = join(dir, 'kubeconfig.json');
    const config = {
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'fake', cluster: { server: this.url } }],
      users: [{ name: 'agent', user: { token: 'fake-token' } }],
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
    obj.metadata.creationTimestamp = prev?.metadata.creationTimestamp ?? obj.metadata.creationTimestamp ?? new Date().toISOString().replace(/\.\d+Z$/, 'Z');
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

  setSecret(secret: SecretObject): void {
    const s = structuredClone(secret);
    s.metadata.namespace ??= 'default';
    if (s.stringData) {
      s.data = { ...(s.data ?? {}) };
      for (const [k, v] of Object.entries(s.stringData)) s.data[k] = Buffer.from(v).toString('base64');
      delete s.stringData;
    }
    s.metadata.resourceVersion = String(++this.#rv);
    this.#secrets.set(`${s.metadata.namespace}/${s.metadata.name}`, s);
  }

  deleteSecret(namespace: string, name: string): void {
    this.#secrets.delete(`${namespace}/${name}`);
  }

  setConfigMap(cm: ConfigMapObject): void {
    const c = structuredClone(cm);
    c.metadata.namespace ??= 'default';
    c.metadata.resourceVersion = String(++this.#rv);
    this.#configMaps.set(`${c.metadata.namespace}/${c.metadata.name}`, c);
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
      if (mode === 'event') this.#send(w, { type: 'ERROR', object: status(410, 'Expired', 'too old resource version') });
      w.res.end();
    }
    this.#watchers.clear();
  }

  bookmark(): void {
    for (const w of this.#watchers) {
      if (w.bookmarks) {
        this.#send(w, { type: 'BOOKMARK', object: { kind: 'VirtualMachineInstance', apiVersion: 'kubevirt.io/v1', metadata: { resourceVersion: String(this.#rv) } } });
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

  watchCount(): number {
    return this.#watchers.size;
  }

  // ---- protocol ----

  #publish(entry: HistoryEntry): void {
    this.#history.push(entry);
    for (const w of this.#watchers) this.#deliver(w, entry);
  }

  #deliver(w: Watcher, e: HistoryEntry): void {
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

  #record(req: IncomingMessage, url: URL, status: number, verb: Verb, parsed: ReturnType<typeof parsePath>): void {
    this.requests.push({
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
    });
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x');
    const p = parsePath(url.pathname);
    const watch = url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1';
    const verb: Verb =
      req.method === 'GET' ? (p.name ? 'get' : watch ? 'watch' : 'list') : req.method === 'POST' ? 'create' : req.method === 'PATCH' ? 'patch' : req.method === 'PUT' ? 'update' : req.method === 'DELETE' ? 'delete' : 'unknown';
    const reply = (code: number, body: unknown) => {
      this.#record(req, url, code, verb, p);
      res.writeHead(code, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    const body = await readBody(req);

    if (url.pathname === VMI_PATH && req.method === 'GET') {
      const selector = parseSelector(url.searchParams.get('labelSelector') ?? undefined);
      if (!watch) {
        const items = [...this.#vmis.values()].filter((v) => selector(v.metadata.labels));
        return reply(200, { apiVersion: 'kubevirt.io/v1', kind: 'VirtualMachineInstanceList', metadata: { resourceVersion: String(this.#rv) }, items });
      }
      const from = url.searchParams.get('resourceVersion') ?? '';
      const fromRv = from === '' || from === '0' ? undefined : Number(from);
      if (fromRv !== undefined && fromRv < this.#compactedRv && this.#goneMode === 'status') {
        return reply(410, status(410, 'Expired', `too old resource version: ${from} (${this.#compactedRv})`));
      }
      this.#record(req, url, 200, verb, p);
      res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
      res.flushHeaders();
      const w: Watcher = { res, selector, bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true', stalled: this.#stallNew };
      if (fromRv !== undefined && fromRv < this.#compactedRv) {
        this.#send(w, { type: 'ERROR', object: status(410, 'Expired', `too old resource version: ${from} (${this.#compactedRv})`) });
        res.end();
        return;
      }
      if (fromRv === undefined) {
        for (const v of this.#vmis.values()) if (selector(v.metadata.labels)) this.#send(w, { type: 'ADDED', object: v });
      } else {
        for (const e of this.#history) if (e.rv > fromRv) this.#deliver(w, e);
      }
      this.#watchers.add(w);
      res.on('close', () => this.#watchers.delete(w));
      return;
    }

    if (p.group === '' && (p.resource === 'secrets' || p.resource === 'configmaps') && req.method === 'GET' && p.namespace && p.name) {
      const store = p.resource === 'secrets' ? this.#secrets : this.#configMaps;
      const obj = store.get(`${p.namespace}/${p.name}`);
      if (!obj) return reply(404, status(404, 'NotFound', `${p.resource} "${p.name}" not found`, { name: p.name, kind: p.resource }));
      return reply(200, obj);
    }

    if (p.group === 'subresources.kubevirt.io' && p.resource === 'virtualmachineinstances' && p.subresource === 'unpause' && p.namespace && p.name) {
      if (req.method !== 'PUT') return reply(405, status(405, 'MethodNotAllowed', `the server does not allow this method on the requested resource`));
      const vmi = this.#vmis.get(`${p.namespace}/${p.name}`);
      if (!vmi) return reply(404, status(404, 'NotFound', `virtualmachineinstance.kubevirt.io "${p.name}" not found`, { name: p.name, group: 'kubevirt.io', kind: 'virtualmachineinstance' }));
      const conflict = (why: string) =>
        reply(409, status(409, 'Conflict', `Operation cannot be fulfilled on virtualmachineinstance.kubevirt.io "${p.name}": ${why}`, { name: p.name, group: 'kubevirt.io', kind: 'virtualmachineinstance' }));
      if (vmi.status?.phase !== 'Running') return conflict('VMI is not running');
      const conditions = (vmi.status.conditions ?? []) as Array<{ type: string; status: string }>;
      if (!conditions.some((c) => c.type === 'Paused' && c.status === 'True')) return conflict('VMI is not paused');
      const next = structuredClone(vmi);
      next.status!.conditions = conditions.filter((c) => c.type !== 'Paused');
      this.applyVmi(next);
      this.unpaused.push(`${p.namespace}/${p.name}`);
      this.#record(req, url, 200, verb, p);
      res.writeHead(200);
      res.end();
      return;
    }

    if (p.group === '' && p.resource === 'events' && p.namespace) {
      if (req.method === 'POST' && !p.name) {
        const ev = JSON.parse(body) as StoredEvent;
        const key = `${p.namespace}/${ev.metadata?.name}`;
        if (!ev.metadata?.name) return reply(422, status(422, 'Invalid', 'metadata.name: Required value'));
        if (this.#events.has(key)) return reply(409, status(409, 'AlreadyExists', `events "${ev.metadata.name}" already exists`));
        ev.metadata.namespace = p.namespace;
        ev.metadata.uid = randomUUID();
        ev.metadata.resourceVersion = String(++this.#rv);
        this.#events.set(key, ev);
        return reply(201, ev);
      }
      if (req.method === 'PATCH' && p.name) {
        const ct = req.headers['content-type'] ?? '';
        if (!/merge-patch\+json|strategic-merge-patch\+json/.test(ct)) return reply(415, status(415, 'UnsupportedMediaType', `the body of the request was in an unknown format: ${ct}`));
        const ev = this.#events.get(`${p.namespace}/${p.name}`);
        if (!ev) return reply(404, status(404, 'NotFound', `events "${p.name}" not found`, { name: p.name, kind: 'events' }));
        Object.assign(ev, JSON.parse(body));
        ev.metadata.resourceVersion = String(++this.#rv);
        return reply(200, ev);
      }
    }
    return reply(404, status(404, 'NotFound', 'the server could not find the requested resource'));
  }
}

function parsePath(path: string): { group: string; resource: string; subresource?: string; namespace?: string; name?: string } {
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
  return { group, resource: rest[0] ?? '', ...(namespace ? { namespace } : {}), ...(rest[1] ? { name: rest[1] } : {}), ...(rest[2] ? { subresource: rest[2] } : {}) };
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}
