// npm run bench:cluster-objects [-- --nodes 1,50 --vmis-per-node 100 --rest-seconds 30 --watch-time-scale 0.02 --project-nodes 5000]
//
// What the cluster component's node-scoped object service costs: the real
// `vmseed cluster` (bin/vmseed, in a process of its own, so its memory and
// CPU are its own) with --objects-listen, its certificate from
// --objects-cert-dir (test/support/test-pki.ts) and its upstream credential
// an admin token of the fake API server in this process (HTTP/2 offered, as
// the API server does, 250 streams per connection at most on the client).
// For each --nodes count N: N × --vmis-per-node VMIs on the fake, each with
// its user-data from a Secret of its own (secretRef), across 10 namespaces,
// and N simulated node agents in this process, each with its own token
// (TokenReview answered by the fake, bound to its node) doing what an agent
// does on start: read each referenced Secret once and keep a watch of it by
// name, through the service (the agent's own ObjectWatches and BoundedWatch
// over a KubeConnection to the service; 8 reads at a time per node, all
// nodes at once). Measures, from /proc/<pid>/{status,stat} of the component:
//   ready: spawn → /readyz 200 (the cluster-wide VMI list done); VmRSS
//     (what process.memoryUsage().rss reports inside it) then;
//   start storm: every node's reads and watches, until every watch is open
//     upstream; its duration, the component's CPU time, the requests it
//     made upstream (by verb and resource) and served, per second;
//   at rest for --rest-seconds after: CPU time, upstream requests; the fake
//     ends each watch after its timeoutSeconds × --watch-time-scale, so the
//     window holds 1/scale times the renewals real time would (and the
//     service's per-watch recheck, every 10 s, at its real rate): real-time
//     rest costs are at most what is measured here;
//   VmRSS and VmHWM after the rest window; open upstream watches (Secret,
//     VMI) and TCP connections to the fake.
// Then a linear projection to --project-nodes nodes of --vmis-per-node VMIs
// from the slope between the smallest and the largest run.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { get } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { ADMIN_USER, FakeKube, type RequestRecord } from '../test/support/fake-kube.ts';
import { testPki } from '../test/support/test-pki.ts';
import type { VmiObject } from '../src/api/objects.ts';
import { KubeConnectionApi, type KubeApi } from '../src/kube/api-client.ts';
import { H2_MAX_STREAMS, KubeConnection } from '../src/kube/connection.ts';
import { ObjectWatches } from '../src/kube/object-watches.ts';
import { BoundedWatch } from '../src/kube/watch.ts';
import type { Watcher } from '../src/kube/list-watch.ts';
import { quantile, until } from './stats.ts';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '1,50' },
    'vmis-per-node': { type: 'string', default: '100' },
    'rest-seconds': { type: 'string', default: '30' },
    'watch-time-scale': { type: 'string', default: '0.02' },
    'project-nodes': { type: 'string', default: '5000' },
    concurrency: { type: 'string', default: '8' },
  },
});
const NODES = values.nodes.split(',').map(Number);
const PER_NODE = Number(values['vmis-per-node']);
const REST_SECONDS = Number(values['rest-seconds']);
const SCALE = Number(values['watch-time-scale']);
const PROJECT_NODES = Number(values['project-nodes']);
const CONCURRENCY = Number(values.concurrency);
const ROOT = new URL('../', import.meta.url).pathname;
const ADMIN_TOKEN = 'bench-admin-token';
const TICK = 100; // USER_HZ: /proc/<pid>/stat counts CPU time in 1/100 s
const silent = pino({ level: 'silent' });

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
}

// VmRSS and VmHWM in MiB, user+system CPU in seconds, of a process.
function sample(pid: number): { rss: number; hwm: number; cpu: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime and stime: fields 14 and 15 of stat(5), 12 and 13 after the name.
  return { rss: kib('VmRSS') / 1024, hwm: kib('VmHWM') / 1024, cpu: (Number(fields[11]) + Number(fields[12])) / TICK };
}

function readyz(port: number): Promise<number> {
  return new Promise((resolve) => {
    const req = get({ host: '127.0.0.1', port, path: '/readyz', agent: false }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('error', () => resolve(0));
  });
}

function byKind(records: readonly RequestRecord[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const r of records) {
    const k = `${r.verb} ${r.resource}${r.status >= 400 ? ` (${r.status})` : ''}`;
    m.set(k, (m.get(k) ?? 0) + 1);
  }
  return m;
}

// One simulated node agent: its token, a connection to the service, the
// agent's own object cache over it; requests and watches counted.
class SimNode {
  readonly node: string;
  readonly connection: KubeConnection;
  readonly cache: ObjectWatches;
  requests = 0;
  watches = 0;
  failures = 0;
  constructor(node: string, url: string, token: string, ca: string) {
    this.node = node;
    this.connection = new KubeConnection({ server: url, token, ca });
    const api = new KubeConnectionApi(this.connection);
    const counted: KubeApi = {
      request: (...args) => {
        this.requests++;
        return api.request(...args);
      },
    };
    const bounded = new BoundedWatch({ connection: this.connection });
    const watcher: Watcher = {
      watch: (...args) => {
        this.watches++;
        return bounded.watch(...args);
      },
    };
    this.cache = new ObjectWatches({ api: counted, watcher, logger: silent });
  }

  // What an agent's start does for each VMI: read its Secret (the first
  // read opens the object's watch), retried as a reconcile would be.
  async start(vmis: readonly VmiObject[]): Promise<void> {
    let next = 0;
    const worker = async () => {
      while (next < vmis.length) {
        const v = vmis[next++];
        const user = `${v.metadata.namespace}/${v.metadata.name}`;
        for (;;) {
          const reader = this.cache.reader(user);
          try {
            await reader.getSecret(v.metadata.namespace!, `ud-${v.metadata.name}`);
            this.cache.use(user, reader.read());
            break;
          } catch {
            this.failures++;
            await new Promise((r) => setTimeout(r, 1000));
          } finally {
            reader.done();
          }
        }
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  }

  async stop(): Promise<void> {
    await this.cache.stop();
    await this.connection.close(100);
  }
}

interface Run {
  nodes: number;
  vmis: number;
  readyMs: number;
  ready: { rss: number; hwm: number; cpu: number };
  stormMs: number;
  stormCpu: number;
  stormUpstream: Map<string, number>;
  stormUpstreamTotal: number;
  stormServed: number;
  stormFailures: number;
  afterStorm: { rss: number; hwm: number; cpu: number };
  restCpu: number;
  restUpstream: Map<string, number>;
  restUpstreamTotal: number;
  restServed: number;
  end: { rss: number; hwm: number; cpu: number };
  secretWatches: number;
  vmiWatches: number;
  connections: number;
  timeoutMedian: number;
}

async function run(nodes: number): Promise<Run> {
  const fake = await FakeKube.start({ watchTimeScale: SCALE, http2: true, adminTokens: [ADMIN_TOKEN] });
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-bench-objects-'));
  const pki = await testPki('vmseed-objects');
  const certDir = join(dir, 'tls');
  await mkdir(certDir);
  await writeFile(join(certDir, 'tls.crt'), pki.serverCert);
  await writeFile(join(certDir, 'tls.key'), pki.serverKey, { mode: 0o600 });
  const kubeconfig = await fake.writeKubeconfig(dir, ADMIN_TOKEN);
  const vmisOf = new Map<string, VmiObject[]>();
  for (let n = 0; n < nodes; n++) {
    const node = `node-${String(n).padStart(4, '0')}`;
    const list: VmiObject[] = [];
    for (let i = 0; i < PER_NODE; i++) {
      const name = `vm-${node}-${String(i).padStart(3, '0')}`;
      const namespace = `ns-${i % 10}`;
      fake.setSecret({
        metadata: { name: `ud-${name}`, namespace },
        stringData: { userdata: `#cloud-config\nhostname: ${name}\n` },
      });
      list.push(
        fake.applyVmi({
          metadata: {
            name,
            namespace,
            labels: { 'kubevirt.io/nodeName': node },
            annotations: { 'vmseed.io/cloud-init': `secretRef: {name: ud-${name}}\n` },
          },
          spec: { hostname: name, domain: {} },
          status: { nodeName: node, phase: 'Running' },
        }),
      );
    }
    vmisOf.set(node, list);
    fake.registerReviewToken(`token-${node}`, {
      username: 'system:serviceaccount:vmseed:vmseed',
      audiences: ['vmseed-cluster'],
      extra: { 'authentication.kubernetes.io/node-name': [node] },
    });
  }
  const vmis = nodes * PER_NODE;
  const port = await freePort();
  const probePort = await freePort();
  const t0 = performance.now();
  const child: ChildProcess = spawn(
    join(ROOT, 'bin/vmseed'),
    [
      'cluster',
      '--objects-listen',
      `127.0.0.1:${port}`,
      '--objects-cert-dir',
      certDir,
      '--kubeconfig',
      kubeconfig,
      '--webhook-listen',
      'off',
      '--probe-listen',
      `127.0.0.1:${probePort}`,
      '--log-level',
      'warn',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr = (stderr + d).slice(-4000)));
  const sims: SimNode[] = [];
  try {
    let ok = false;
    const deadline = performance.now() + 120_000;
    while (!ok && performance.now() < deadline) {
      ok = (await readyz(probePort)) === 200;
      if (!ok) await new Promise((r) => setTimeout(r, 20));
    }
    if (!ok) throw new Error(`vmseed cluster not ready after 120 s\n${stderr}`);
    const readyMs = performance.now() - t0;
    const pid = child.pid!;
    await new Promise((r) => setTimeout(r, 1000));
    const ready = sample(pid);

    for (const node of vmisOf.keys())
      sims.push(new SimNode(node, `https://127.0.0.1:${port}`, `token-${node}`, pki.caCert));
    const stormFrom = fake.requests.length;
    const s0 = performance.now();
    await Promise.all(sims.map((s) => s.start(vmisOf.get(s.node)!)));
    if (!(await until(() => fake.objectWatchCount() >= vmis, 120_000)))
      throw new Error(`${fake.objectWatchCount()} of ${vmis} watches open upstream after 120 s\n${stderr}`);
    const stormMs = performance.now() - s0;
    const afterStorm = sample(pid);
    const storm = fake.requests.slice(stormFrom).filter((r) => r.user === ADMIN_USER);
    const servedAtStorm = sims.reduce((a, s) => a + s.requests + s.watches, 0);

    const restFrom = fake.requests.length;
    await new Promise((r) => setTimeout(r, REST_SECONDS * 1000));
    const end = sample(pid);
    const rest = fake.requests.slice(restFrom).filter((r) => r.user === ADMIN_USER);
    const servedAtEnd = sims.reduce((a, s) => a + s.requests + s.watches, 0);
    const asked = fake.requests
      .filter((r) => r.verb === 'watch' && r.resource === 'secrets')
      .map((r) => Number(r.query.timeoutSeconds));
    return {
      nodes,
      vmis,
      readyMs,
      ready,
      stormMs,
      stormCpu: afterStorm.cpu - ready.cpu,
      stormUpstream: byKind(storm),
      stormUpstreamTotal: storm.length,
      stormServed: servedAtStorm,
      stormFailures: sims.reduce((a, s) => a + s.failures, 0),
      afterStorm,
      restCpu: end.cpu - afterStorm.cpu,
      restUpstream: byKind(rest),
      restUpstreamTotal: rest.length,
      restServed: servedAtEnd - servedAtStorm,
      end,
      secretWatches: fake.objectWatchCount(),
      vmiWatches: fake.watchCount(),
      connections: fake.connectionCount(),
      timeoutMedian: quantile(asked, 0.5),
    };
  } finally {
    await Promise.all(sims.map((s) => s.stop()));
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
    await fake.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const load0 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
const runs: Run[] = [];
for (const n of NODES) runs.push(await run(n));
const load1 = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

// The measured table: a row per figure, a column per run.
const mib = (x: number) => `${x.toFixed(1)} MiB`;
const s = (x: number) => `${x.toFixed(2)} s`;
const perS = (n: number, ms: number) => `${n} (${((n * 1000) / ms).toFixed(0)}/s)`;
type Row = [string, (r: Run) => string];
const kinds = (pick: (r: Run) => Map<string, number>) => [...new Set(runs.flatMap((r) => [...pick(r).keys()]))].sort();
const rows: Row[] = [
  ['VMIs (1 Secret each)', (r) => String(r.vmis)],
  ['spawn → /readyz 200', (r) => s(r.readyMs / 1000)],
  ['VmRSS when ready', (r) => mib(r.ready.rss)],
  ['start storm: duration', (r) => s(r.stormMs / 1000)],
  ['start storm: CPU (user+sys)', (r) => `${s(r.stormCpu)} (${((r.stormCpu * 1000) / r.stormMs).toFixed(2)} cores)`],
  ['start storm: requests served', (r) => perS(r.stormServed, r.stormMs)],
  ['start storm: upstream requests', (r) => perS(r.stormUpstreamTotal, r.stormMs)],
  ...kinds((r) => r.stormUpstream).map((k): Row => [`  ${k}`, (r) => String(r.stormUpstream.get(k) ?? 0)]),
  ['start storm: client retries (429/503)', (r) => String(r.stormFailures)],
  ['VmRSS after the storm', (r) => mib(r.afterStorm.rss)],
  [`rest ${REST_SECONDS} s: CPU (user+sys)`, (r) => `${s(r.restCpu)} (${(r.restCpu / REST_SECONDS).toFixed(3)} cores)`],
  [`rest: requests served`, (r) => perS(r.restServed, REST_SECONDS * 1000)],
  [`rest: upstream requests`, (r) => perS(r.restUpstreamTotal, REST_SECONDS * 1000)],
  ...kinds((r) => r.restUpstream).map((k): Row => [`  ${k}`, (r) => String(r.restUpstream.get(k) ?? 0)]),
  ['VmRSS at the end', (r) => mib(r.end.rss)],
  ['VmHWM (peak)', (r) => mib(r.end.hwm)],
  ['open upstream watches: Secrets', (r) => String(r.secretWatches)],
  ['open upstream watches: VMIs', (r) => String(r.vmiWatches)],
  ['TCP connections to the fake', (r) => String(r.connections)],
];
function print(header: string[], table: string[][]): void {
  const widths = header.map((h, i) => Math.max(h.length, ...table.map((row) => row[i].length)));
  const line = (cells: string[]) =>
    cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
  console.log(line(header));
  for (const row of table) console.log(line(row));
}
console.log(
  `vmseed bench:cluster-objects — ${PER_NODE} VMIs per node, rest ${REST_SECONDS} s at watch time ×${SCALE}, ` +
    `${CONCURRENCY} reads at a time per node; load ${load0} before, ${load1} after`,
);
print(
  ['', ...runs.map((r) => `${r.nodes} node${r.nodes === 1 ? '' : 's'}`)],
  rows.map(([label, f]) => [label, ...runs.map(f)]),
);

// Projection: linear in VMIs (one Secret watch each) between the smallest
// and the largest run.
if (runs.length >= 2) {
  const a = runs[0];
  const b = runs.at(-1)!;
  const dv = b.vmis - a.vmis;
  const rssPerVmi = (b.end.rss - a.end.rss) / dv;
  const hwmPerVmi = (b.end.hwm - a.end.hwm) / dv;
  const stormCpuPerVmi = b.stormCpu / b.vmis;
  const restCoresPerWatch = (b.restCpu - a.restCpu) / REST_SECONDS / dv;
  const target = PROJECT_NODES * PER_NODE;
  const projected = (base: number, slope: number) => base + slope * (target - a.vmis);
  const realRenewalsPerS = target / b.timeoutMedian;
  console.log('');
  console.log(
    `projection to ${PROJECT_NODES} nodes × ${PER_NODE} VMIs = ${target} VMIs and Secret watches through one component (linear from ${a.nodes} → ${b.nodes} nodes)`,
  );
  print(
    ['', 'per VMI / watch', `${target} VMIs`],
    [
      ['VmRSS at rest', `${(rssPerVmi * 1024).toFixed(1)} KiB`, mib(projected(a.end.rss, rssPerVmi))],
      ['VmHWM', `${(hwmPerVmi * 1024).toFixed(1)} KiB`, mib(projected(a.end.hwm, hwmPerVmi))],
      [
        'start storm CPU (all nodes at once)',
        `${(stormCpuPerVmi * 1000).toFixed(2)} ms`,
        `${(stormCpuPerVmi * target).toFixed(0)} s (${((stormCpuPerVmi * target) / 60).toFixed(1)} min of one core)`,
      ],
      [
        `rest CPU at watch time ×${SCALE} (upper bound for real time)`,
        `${(restCoresPerWatch * 1e6).toFixed(1)} µs/s`,
        `${(restCoresPerWatch * target).toFixed(2)} cores`,
      ],
      ['upstream Secret watches', '1', String(target)],
      [
        `upstream HTTP/2 connections (${H2_MAX_STREAMS} streams each)`,
        `1/${H2_MAX_STREAMS}`,
        String(Math.ceil(target / H2_MAX_STREAMS)),
      ],
      [
        `watch renewals in real time (median timeoutSeconds ${b.timeoutMedian} s)`,
        `1/${b.timeoutMedian} s`,
        `${realRenewalsPerS.toFixed(0)}/s`,
      ],
      ['service rechecks of open watches (every 10 s)', '0.1/s', `${(target / 10).toFixed(0)}/s`],
    ],
  );
}
