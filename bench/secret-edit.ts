// npm run bench:secret-edit [-- --vmis 200 --edits 100 --rest-seconds 60 --resync-period 5s --watch-time-scale 0.02]
//
// The real `vmseed agent` (bin/vmseed, as it ships) against the fake API
// server in this process, with VMIs whose user-data comes from a Secret each
// (secretRef). Measures:
//   Secret edit → new seed image on disk: the Secret written on the fake
//     (its watch event sent) → the VMI's new content-addressed image in the
//     state directory; edits one at a time, on VMIs picked in turn; median
//     and p99;
//   Secret edit → the NoCloud HTTP datasource serving it: the same edits,
//     the agent's datasource (--datasource-listen) polled every ~5 ms for
//     the VMI's user-data until it holds the edit (each poll from another
//     loopback address, so the per-source rate limit is not what is timed);
//   at rest: the API requests the agent makes over --rest-seconds once
//     everything is seeded, by verb and resource, scaled to an hour, with
//     resyncs every --resync-period (each re-renders every VMI);
//   open watches on the fake: VMI watches and per-object watches;
//   watch renewals: the fake ends each watch after its timeoutSeconds ×
//     --watch-time-scale, so the rest window holds 1/scale times as many
//     renewals as real time would; counted and scaled back to an hour, beside
//     the timeoutSeconds the agent asked.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { get } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { FakeKube } from '../test/support/fake-kube.ts';
import type { VmiObject } from '../src/api/objects.ts';
import { ImageStore } from '../src/disk/store.ts';
import { signToken } from '../src/datasource/tokens.ts';
import { quantile, until } from './stats.ts';

const { values } = parseArgs({
  options: {
    vmis: { type: 'string', default: '200' },
    edits: { type: 'string', default: '100' },
    'rest-seconds': { type: 'string', default: '60' },
    'resync-period': { type: 'string', default: '5s' },
    'watch-time-scale': { type: 'string', default: '0.02' },
  },
});
const VMIS = Number(values.vmis);
const EDITS = Number(values.edits);
const REST_SECONDS = Number(values['rest-seconds']);
const SCALE = Number(values['watch-time-scale']);
const NODE = 'bench-node';
const ROOT = new URL('../', import.meta.url).pathname;

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
    status: { nodeName: NODE, phase: 'Running' },
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

let polls = 0;
// The user-data the datasource serves for the VMI ('' for anything but 200).
function servedUserData(port: number, key: Uint8Array, v: VmiObject): Promise<string> {
  const localAddress = `127.0.${(polls >> 8) & 255}.${2 + (polls++ % 250)}`;
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

const fake = await FakeKube.start({ watchTimeScale: SCALE });
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
  vmis.push(fake.applyVmi(v));
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
  ],
  { stdio: ['ignore', 'ignore', 'pipe'] },
);
let stderr = '';
child.stderr.on('data', (d) => (stderr += d));

try {
  const t0 = performance.now();
  const seeded = await until(() => vmis.every((v) => images(state, v).length === 1), 120_000);
  if (!seeded) throw new Error(`not every VMI seeded after 120 s\n${stderr.slice(0, 2000)}`);
  const coldMs = performance.now() - t0;
  await until(() => fake.objectWatchCount() === VMIS, 10_000);
  if (!(await untilServed(datasourcePort, key, vmis[0], 0, 10_000)))
    throw new Error(`the datasource does not serve ${vmis[0].metadata.name}\n${stderr.slice(0, 2000)}`);

  // At rest: every VMI seeded, every watch open; only resyncs and renewals run.
  const restFrom = fake.requests.length;
  await new Promise((r) => setTimeout(r, REST_SECONDS * 1000));
  const rest = fake.requests.slice(restFrom);
  const byKind = new Map<string, number>();
  for (const r of rest) {
    const k = `${r.verb} ${r.resource}`;
    byKind.set(k, (byKind.get(k) ?? 0) + 1);
  }
  const reads = rest.filter((r) => (r.verb === 'get' || r.verb === 'list') && r.resource !== 'events').length;
  const perHour = (n: number) => Math.round((n * 3600) / REST_SECONDS);

  const latencies: number[] = [];
  const servedLatencies: number[] = [];
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
    const served = untilServed(datasourcePort, key, v, e + 1, 30_000).then((ok) => ok && performance.now() - start);
    const [disk, http] = await Promise.all([onDisk, served]);
    if (disk === false)
      throw new Error(`edit ${e} of ${v.metadata.name}: no new image after 30 s\n${stderr.slice(0, 2000)}`);
    if (http === false)
      throw new Error(`edit ${e} of ${v.metadata.name}: not served after 30 s\n${stderr.slice(0, 2000)}`);
    latencies.push(disk);
    servedLatencies.push(http);
  }
  latencies.sort((a, b) => a - b);
  servedLatencies.sort((a, b) => a - b);
  const ms = (x: number) => `${x.toFixed(1)} ms`;
  console.log(`vmseed bench:secret-edit — ${VMIS} VMIs with a Secret each, --resync-period ${values['resync-period']}`);
  console.log(`cold start (spawn → every image on disk): ${(coldMs / 1000).toFixed(2)} s`);
  console.log(
    `Secret edit → new image on disk (${EDITS} edits): median ${ms(quantile(latencies, 0.5))}, p99 ${ms(quantile(latencies, 0.99))}, max ${ms(latencies.at(-1)!)}`,
  );
  console.log(
    `Secret edit → served by the NoCloud HTTP datasource (polled every ~5 ms): median ${ms(quantile(servedLatencies, 0.5))}, p99 ${ms(quantile(servedLatencies, 0.99))}, max ${ms(servedLatencies.at(-1)!)}`,
  );
  console.log(
    `at rest over ${REST_SECONDS} s: ${rest.length} requests (watch renewals at watch time ×${SCALE}), reads of objects ${reads} (${perHour(reads)}/h)`,
  );
  // Watches renew at the fake's scaled time: their hourly figure is real time.
  for (const [k, n] of [...byKind].sort())
    console.log(
      `  ${k}: ${n} (${k.startsWith('watch ') ? Math.round((n * 3600 * SCALE) / REST_SECONDS) : perHour(n)}/h)`,
    );
  console.log(`open watches: ${fake.objectWatchCount()} on Secrets/ConfigMaps, ${fake.watchCount()} on VMIs`);
  // Renewals: watches started in the rest window (each replaces one the
  // server ended), in real time an hour holds SCALE times as many windows.
  const renewals = rest.filter((r) => r.verb === 'watch' && r.resource === 'secrets');
  const asked = fake.requests
    .filter((r) => r.verb === 'watch' && r.resource === 'secrets')
    .map((r) => Number(r.query.timeoutSeconds))
    .sort((a, b) => a - b);
  const realHour = (n: number) => Math.round((n * 3600 * SCALE) / REST_SECONDS);
  console.log(
    `Secret watch renewals over ${REST_SECONDS} s at watch time ×${SCALE}: ${renewals.length} ` +
      `(${renewals.filter((r) => r.query.resourceVersion).length} from a resourceVersion) → ${realHour(renewals.length)}/h ` +
      `in real time for ${VMIS} watches; timeoutSeconds asked ${asked[0]}–${asked.at(-1)} s, ` +
      `median ${quantile(asked, 0.5)} s`,
  );
} finally {
  child.kill('SIGTERM');
  await new Promise((r) => child.once('exit', r));
  await fake.close();
  await rm(dir, { recursive: true, force: true });
}
