// npm run bench:secret-edit [-- --vmis 200 --edits 100 --rest-seconds 60 --resync-period 5s --watch-time-scale 0.02 --path direct|service|both]
//
// The real `vmseed agent` (bin/vmseed, as it ships) against the fake API
// server in this process (HTTP/2 offered, as the API server does), with VMIs
// whose user-data comes from a Secret each (secretRef), on one or both
// paths (--path, default both), side by side in one table with their ratio:
//   direct: the agent reads Secrets from the API server with its own
//     credential (as before the object service);
//   service: the agent run with --objects-url/--objects-token-file/
//     --objects-ca-file, reading them through the cluster component's
//     node-scoped object service, started in this process with
//     startObjectService against the same fake (its upstream connection an
//     admin token of the fake; TokenReview answered by the fake for the
//     agent's token, bound to the bench's node).
// Measures, per path:
//   Secret edit → new seed image on disk: the Secret written on the fake
//     (its watch event sent) → the VMI's new content-addressed image in the
//     state directory; edits one at a time, on VMIs picked in turn; median,
//     p99 and max;
//   Secret edit → the NoCloud HTTP datasource serving it: the same edits,
//     the agent's datasource (--datasource-listen) polled every ~5 ms for
//     the VMI's user-data until it holds the edit (from its launcher pod's
//     addresses, set on the fake: the datasource answers a VMI only from
//     them; four per pod, taken in turn, so the per-source rate limit is
//     not what is timed);
//   at rest: the API requests made over --rest-seconds once everything is
//     seeded, by credential (the agent's; the component's on the service
//     path), verb and resource, scaled to an hour, with resyncs every
//     --resync-period (each re-renders every VMI);
//   open watches on the fake: VMI watches (the agent's, and on the service
//     path the component's) and per-object watches (the component holds
//     them upstream on the service path, one per watch the agent holds on it);
//   watch renewals: the fake ends each watch after its timeoutSeconds ×
//     --watch-time-scale, so the rest window holds 1/scale times as many
//     renewals as real time would; counted and scaled back to an hour, beside
//     the timeoutSeconds the agent asked;
//   the agent process's VmHWM and VmRSS (/proc/<pid>/status) at the end.
// The service path's component shares this process with the fake and the
// pollers, so its CPU is not the agent's; bench:cluster-objects measures it
// in a process of its own.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { get } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { ADMIN_USER, FakeKube } from '../test/support/fake-kube.ts';
import { testPki } from '../test/support/test-pki.ts';
import type { VmiObject } from '../src/api/objects.ts';
import { ImageStore } from '../src/disk/store.ts';
import { signToken } from '../src/datasource/tokens.ts';
import { KubeConnectionApi } from '../src/kube/api-client.ts';
import { startObjectService, type ObjectService } from '../src/cluster/objects/object-server.ts';
import { quantile, until } from './stats.ts';

const { values } = parseArgs({
  options: {
    vmis: { type: 'string', default: '200' },
    edits: { type: 'string', default: '100' },
    'rest-seconds': { type: 'string', default: '60' },
    'resync-period': { type: 'string', default: '5s' },
    'watch-time-scale': { type: 'string', default: '0.02' },
    path: { type: 'string', default: 'both' },
  },
});
const VMIS = Number(values.vmis);
const EDITS = Number(values.edits);
const REST_SECONDS = Number(values['rest-seconds']);
const SCALE = Number(values['watch-time-scale']);
if (!['direct', 'service', 'both'].includes(values.path)) throw new Error(`--path: direct, service or both`);
const PATHS = (values.path === 'both' ? ['direct', 'service'] : [values.path]) as Array<'direct' | 'service'>;
const NODE = 'bench-node';
const ROOT = new URL('../', import.meta.url).pathname;
const ADMIN_TOKEN = 'bench-admin-token';
const OBJECTS_TOKEN = 'bench-node-objects-token';

// Its launcher pod's UID (status.activePods), the pod set on the fake.
function podUidOf(i: number): string {
  return `00000000-0000-4000-8000-${String(i).padStart(12, '0')}`;
}

function vmiOf(i: number): VmiObject {
  const name = `vm-${String(i).padStart(4, '0')}`;
  return {
    metadata: {
      name,
      namespace: `ns-${i % 10}`,
      labels: { 'kubevirt.io/nodeName': NODE },
      annotations: { 'vmseed.io/cloud-init': `secretRef: {name: ud-${name}}\n` },
    },
    spec: { hostname: name, domain: {} },
    status: { nodeName: NODE, phase: 'Running', activePods: { [podUidOf(i)]: NODE } },
  };
}

function writeSecret(fake: FakeKube, v: VmiObject, generation: number): void {
  fake.setSecret({
    metadata: { name: `ud-${v.metadata.name}`, namespace: v.metadata.namespace! },
    stringData: { userdata: `#cloud-config\nhostname: ${v.metadata.name}\n# generation ${generation}\n` },
  });
}

// A port free now, for the agent's datasource listener.
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
}

// The addresses of VMI i's launcher pod: the datasource answers a VMI only
// from its launcher pod's address; polls rotate among four, so the
// per-source rate limit is not what is timed.
const LAUNCHER_IPS = 4;
function launcherIps(i: number): string[] {
  return Array.from({ length: LAUNCHER_IPS }, (_, j) => `127.${10 + j}.${Math.floor(i / 250)}.${1 + (i % 250)}`);
}
const ipsOf = new Map<string, string[]>();

let polls = 0;
// The user-data the datasource serves for the VMI ('' for anything but 200).
function servedUserData(port: number, key: Uint8Array, v: VmiObject): Promise<string> {
  const localAddress = ipsOf.get(v.metadata.name)![polls++ % LAUNCHER_IPS];
  return new Promise((resolve) => {
    const req = get(
      { host: '127.0.0.1', port, localAddress, agent: false, path: `/v1/${signToken(key, v.metadata.uid!)}/user-data` },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve(res.statusCode === 200 ? Buffer.concat(chunks).toString() : ''));
        res.on('error', () => resolve(''));
      },
    );
    req.on('error', () => resolve(''));
  });
}

// Polls the datasource every ~5 ms until it serves the VMI's generation.
async function untilServed(port: number, key: Uint8Array, v: VmiObject, generation: number, timeoutMs: number) {
  const deadline = performance.now() + timeoutMs;
  while (performance.now() < deadline) {
    if ((await servedUserData(port, key, v)).includes(`# generation ${generation}\n`)) return true;
    await new Promise((r) => setTimeout(r, 5));
  }
  return false;
}

function images(state: string, v: VmiObject): string[] {
  const dir = new ImageStore({ root: state }).dirFor({
    namespace: v.metadata.namespace!,
    name: v.metadata.name,
    uid: v.metadata.uid!,
  });
  try {
    return readdirSync(dir).filter((n) => n.endsWith('.iso') && !n.startsWith('.'));
  } catch {
    return [];
  }
}

// VmHWM and VmRSS of a process, in MiB (undefined once it is gone).
function memoryOf(pid: number): { hwm: number; rss: number } | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
    return { hwm: kib('VmHWM') / 1024, rss: kib('VmRSS') / 1024 };
  } catch {
    return undefined;
  }
}

interface Result {
  coldMs: number;
  disk: number[];
  served: number[];
  // at rest, by `who: verb resource`
  rest: Map<string, number>;
  restTotal: number;
  agentReads: number;
  componentReads: number;
  objectWatches: number;
  vmiWatches: number;
  serviceWatches: number | undefined;
  renewals: number;
  renewalsFromRv: number;
  asked: number[];
  agentMemory: { hwm: number; rss: number } | undefined;
  connections: number;
}

async function run(path: 'direct' | 'service'): Promise<Result> {
  const fake = await FakeKube.start({ watchTimeScale: SCALE, http2: true, adminTokens: [ADMIN_TOKEN] });
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-bench-secret-'));
  const state = join(dir, 'seeds');
  const kubeconfig = await fake.writeKubeconfig(dir);
  const key = new Uint8Array(randomBytes(32));
  const keyFile = join(dir, 'datasource-keys');
  await writeFile(keyFile, Buffer.from(key).toString('base64') + '\n', { mode: 0o600 });
  const datasourcePort = await freePort();
  const vmis: VmiObject[] = [];
  for (let i = 0; i < VMIS; i++) {
    const v = vmiOf(i);
    writeSecret(fake, v, 0);
    const applied = fake.applyVmi(v);
    vmis.push(applied);
    ipsOf.set(v.metadata.name, launcherIps(i));
    fake.setLauncherPod(
      v.metadata.namespace!,
      `virt-launcher-${v.metadata.name}`,
      podUidOf(i),
      NODE,
      launcherIps(i),
      applied.metadata.uid!,
    );
  }

  // The service path: the object service in this process, the agent pointed at it.
  let service: ObjectService | undefined;
  const upstream = path === 'service' ? fake.connection(ADMIN_TOKEN) : undefined;
  const objectsFlags: string[] = [];
  if (upstream) {
    const pki = await testPki('vmseed-objects');
    fake.registerReviewToken(OBJECTS_TOKEN, {
      username: 'system:serviceaccount:vmseed:vmseed',
      audiences: ['vmseed-cluster'],
      extra: { 'authentication.kubernetes.io/node-name': [NODE] },
    });
    service = await startObjectService({
      listen: { host: '127.0.0.1', port: 0 },
      tls: { cert: pki.serverCert, key: pki.serverKey },
      connection: upstream,
      api: new KubeConnectionApi(upstream),
      logger: pino({ level: 'warn' }),
      agentServiceAccount: 'vmseed:vmseed',
    });
    const live = service;
    if (!(await until(() => live.problem() === undefined, 30_000)))
      throw new Error(`the object service is not ready: ${live.problem()}`);
    await writeFile(join(dir, 'objects-token'), OBJECTS_TOKEN + '\n', { mode: 0o600 });
    await writeFile(join(dir, 'objects-ca.crt'), pki.caCert);
    objectsFlags.push(
      '--objects-url',
      `https://127.0.0.1:${service.address.port}`,
      '--objects-token-file',
      join(dir, 'objects-token'),
      '--objects-ca-file',
      join(dir, 'objects-ca.crt'),
    );
  }

  const child = spawn(
    join(ROOT, 'bin/vmseed'),
    [
      'agent',
      '--kubeconfig',
      kubeconfig,
      '--node-name',
      NODE,
      '--state-dir',
      state,
      '--libvirt',
      'off',
      '--listen',
      '127.0.0.1:0',
      '--status-listen',
      '127.0.0.1:0',
      '--log-level',
      'warn',
      '--resync-period',
      values['resync-period'],
      '--datasource-listen',
      `127.0.0.1:${datasourcePort}`,
      '--datasource-key-file',
      keyFile,
      ...objectsFlags,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));

  try {
    const t0 = performance.now();
    const seeded = await until(() => vmis.every((v) => images(state, v).length === 1), 120_000);
    if (!seeded) throw new Error(`${path}: not every VMI seeded after 120 s\n${stderr.slice(0, 2000)}`);
    const coldMs = performance.now() - t0;
    await until(() => fake.objectWatchCount() === VMIS, 10_000);
    if (!(await untilServed(datasourcePort, key, vmis[0], 0, 10_000)))
      throw new Error(`${path}: the datasource does not serve ${vmis[0].metadata.name}\n${stderr.slice(0, 2000)}`);

    // At rest: every VMI seeded, every watch open; only resyncs and renewals run.
    const restFrom = fake.requests.length;
    await new Promise((r) => setTimeout(r, REST_SECONDS * 1000));
    const rest = fake.requests.slice(restFrom);
    const objectWatches = fake.objectWatchCount();
    const vmiWatches = fake.watchCount();
    const serviceWatches = service ? [...service.watches().values()].reduce((a, b) => a + b, 0) : undefined;
    const connections = fake.connectionCount();
    const who = (user: string) => (user === ADMIN_USER ? 'component' : 'agent');
    const byKind = new Map<string, number>();
    for (const r of rest) {
      const k = `${who(r.user)}: ${r.verb} ${r.resource}`;
      byKind.set(k, (byKind.get(k) ?? 0) + 1);
    }
    const isRead = (r: (typeof rest)[number]) =>
      (r.verb === 'get' || r.verb === 'list') && r.resource !== 'events' && r.resource !== 'tokenreviews';
    // Renewals: watches started in the rest window (each replaces one the
    // server ended), in real time an hour holds SCALE times as many windows.
    const renewals = rest.filter((r) => r.verb === 'watch' && r.resource === 'secrets');

    const disk: number[] = [];
    const served: number[] = [];
    for (let e = 0; e < EDITS; e++) {
      const v = vmis[(e * 7) % VMIS];
      const before = images(state, v).sort().join();
      await new Promise((r) => setTimeout(r, 20));
      const start = performance.now();
      writeSecret(fake, v, e + 1);
      const onDisk = until(() => {
        const now = images(state, v);
        return now.length >= 1 && now.sort().join() !== before && !now.every((n) => before.includes(n));
      }, 30_000).then((ok) => ok && performance.now() - start);
      const http = untilServed(datasourcePort, key, v, e + 1, 30_000).then((ok) => ok && performance.now() - start);
      const [d, h] = await Promise.all([onDisk, http]);
      if (d === false)
        throw new Error(`${path}: edit ${e} of ${v.metadata.name}: no new image after 30 s\n${stderr.slice(0, 2000)}`);
      if (h === false)
        throw new Error(`${path}: edit ${e} of ${v.metadata.name}: not served after 30 s\n${stderr.slice(0, 2000)}`);
      disk.push(d);
      served.push(h);
    }
    const agentMemory = memoryOf(child.pid!);
    return {
      coldMs,
      disk,
      served,
      rest: byKind,
      restTotal: rest.length,
      agentReads: rest.filter((r) => isRead(r) && who(r.user) === 'agent').length,
      componentReads: rest.filter((r) => isRead(r) && who(r.user) === 'component').length,
      objectWatches,
      vmiWatches,
      serviceWatches,
      renewals: renewals.length,
      renewalsFromRv: renewals.filter((r) => r.query.resourceVersion).length,
      asked: fake.requests
        .filter((r) => r.verb === 'watch' && r.resource === 'secrets')
        .map((r) => Number(r.query.timeoutSeconds))
        .sort((a, b) => a - b),
      agentMemory,
      connections,
    };
  } finally {
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
    await service?.close();
    await upstream?.close(100);
    await fake.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const results = new Map<'direct' | 'service', Result>();
for (const path of PATHS) results.set(path, await run(path));

// One table: a row per figure, a column per path, and service ÷ direct.
const perHour = (n: number) => Math.round((n * 3600) / REST_SECONDS);
// Watches renew at the fake's scaled time: their hourly figure is real time.
const realHour = (n: number) => Math.round((n * 3600 * SCALE) / REST_SECONDS);
const ms = (x: number) => `${x.toFixed(1)} ms`;
type Row = [string, (r: Result) => string, ((r: Result) => number) | undefined];
const kinds = [...new Set([...results.values()].flatMap((r) => [...r.rest.keys()]))].sort();
const rows: Row[] = [
  ['cold start (spawn → every image on disk)', (r) => `${(r.coldMs / 1000).toFixed(2)} s`, (r) => r.coldMs],
  ...(['disk', 'served'] as const).flatMap((what) =>
    (['median', 'p99', 'max'] as const).map((q): Row => {
      const at = (r: Result) => (q === 'max' ? Math.max(...r[what]) : quantile(r[what], q === 'median' ? 0.5 : 0.99));
      const label = what === 'disk' ? 'edit → new image on disk' : 'edit → served by the datasource';
      return [`${label}, ${q}`, (r) => ms(at(r)), at];
    }),
  ),
  [`requests at rest over ${REST_SECONDS} s (all)`, (r) => String(r.restTotal), (r) => r.restTotal],
  [
    'reads of objects at rest, agent credential',
    (r) => `${r.agentReads} (${perHour(r.agentReads)}/h)`,
    (r) => r.agentReads,
  ],
  [
    'reads of objects at rest, component credential',
    (r) => `${r.componentReads} (${perHour(r.componentReads)}/h)`,
    (r) => r.componentReads,
  ],
  ...kinds.map((k): Row => [
    `  ${k}`,
    (r) => {
      const n = r.rest.get(k) ?? 0;
      return `${n} (${k.includes(': watch ') ? realHour(n) : perHour(n)}/h)`;
    },
    (r) => r.rest.get(k) ?? 0,
  ]),
  ['open watches on the fake: Secrets', (r) => String(r.objectWatches), (r) => r.objectWatches],
  ['open VMI watches on the fake (agent + component)', (r) => String(r.vmiWatches), (r) => r.vmiWatches],
  [
    'watches forwarded by the object service',
    (r) => (r.serviceWatches === undefined ? '–' : String(r.serviceWatches)),
    undefined,
  ],
  ['TCP connections to the fake (HTTP/2)', (r) => String(r.connections), (r) => r.connections],
  [
    `Secret watch renewals at rest (×${SCALE} watch time)`,
    (r) => `${r.renewals} (${r.renewalsFromRv} from rv) → ${realHour(r.renewals)}/h real`,
    (r) => r.renewals,
  ],
  [
    'timeoutSeconds asked upstream (min–max, median)',
    (r) => `${r.asked[0]}–${r.asked.at(-1)} s, ${quantile(r.asked, 0.5)} s`,
    undefined,
  ],
  [
    'agent VmHWM (peak RSS)',
    (r) => (r.agentMemory ? `${r.agentMemory.hwm.toFixed(1)} MiB` : '?'),
    (r) => r.agentMemory?.hwm ?? NaN,
  ],
  [
    'agent VmRSS at the end',
    (r) => (r.agentMemory ? `${r.agentMemory.rss.toFixed(1)} MiB` : '?'),
    (r) => r.agentMemory?.rss ?? NaN,
  ],
];
const columns = PATHS.map((p) => (p === 'direct' ? 'direct (API server)' : 'service (--objects-url)'));
const both = results.size === 2;
const table = rows.map(([label, text, num]) => {
  const cells = PATHS.map((p) => text(results.get(p)!));
  if (both) {
    const [d, s] = PATHS.map((p) => num?.(results.get(p)!));
    cells.push(
      num && d !== undefined && s !== undefined && d > 0 && Number.isFinite(s) ? `×${(s / d).toFixed(2)}` : '–',
    );
  }
  return [label, ...cells];
});
const header = ['', ...columns, ...(both ? ['service ÷ direct'] : [])];
const widths = header.map((h, i) => Math.max(h.length, ...table.map((row) => row[i].length)));
const line = (cells: string[]) =>
  cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
console.log(
  `vmseed bench:secret-edit — ${VMIS} VMIs with a Secret each, ${EDITS} edits, --resync-period ${values['resync-period']}, fake API server HTTP/2, load ${readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')}`,
);
console.log(line(header));
for (const row of table) console.log(line(row));
