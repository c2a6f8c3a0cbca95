// Load on the NoCloud HTTP datasource: an open-loop loopback client (undici)
// sends a fixed request rate (default 1,000/s for 30 s) across 500 VMIs and
// all four files, and measures each request from the moment it was due (so
// a stalled client or server cannot hide latency). The same load against a
// bare node:http server returning a fixed body is the reference floor.
// The flood row runs the same load from 127.0.0.2 (32 connections: the
// per-source cap is on) while 127.0.0.1 tries to hold --flood half-open
// connections (half a request line, never read): the guests' latency with
// one bad client on the node.
//
// --redirect adds the hop guests take in a cluster (root: it makes network
// namespaces of its own): the load generator in a "launcher pod" namespace,
// the datasource listener in a "node" namespace on the node's address, and
// vmseed's nftables DNAT of 169.254.169.254:80 between them; beside it the
// same path without the DNAT (to the node's address directly).
//
// The IMDS rows: /v1/<token>/identity and /token of every VMI (Metadata:
// true, tokens read from a pods tree like the kubelet's) at the same rate;
// then the same load over VMIs 1..N-1 without and with VM 0 flooding at
// --imds-flood req/s from a load generator in its own thread: the flood's
// 429s, and the ratio of the others' p99. The flooding guest is a flood
// tool on 64 keep-alive connections: it sends whenever a connection is
// free, up to the rate, and a request due while all 64 wait is not sent
// (wrk, hey -c 64); a client that queued them instead would grow without
// bound, since vmseed does not read a refused connection for a second or
// two. A third kind of row has VM 0 well behaved at its bucket's rate
// (100/s, --imds-allowance): what the flooding VM is entitled to costs the
// others that much anyway. On a machine of few cores the
// flood's own client takes CPU the others' server and client would have
// had, whatever server answers it; the reference row sends the same flood to
// a bare node:http server in its own thread that answers every request 429
// and does nothing else, while the others load vmseed: the others' p99 under
// vmseed's flood over that is what answering the flood costs vmseed beyond
// the least any server could spend. Beside the latencies, the CPU time the
// flood adds to each server's thread per flood request: what one refusal
// costs, which a loaded machine stretches far less than it stretches p99.
// Unless --no-reference, the three kinds of rows also run, in turn with
// vmseed's, against bare-imds (imds-server-worker.ts): the least server that
// keeps IMDS's contract (the Metadata header, a bucket per VM, 429 with
// Retry-After and the refused connection held as vmseed holds it, fixed
// answers). Its ratio is what VM 0 costs the others on this machine
// whatever a server does beyond the contract.
//
//   npm run bench:imds -- [--seconds 30] [--rate 1000] [--flood 1000] [--no-reference] [--redirect]
//                         [--imds-flood 10000] [--imds-allowance 100] [--imds-repeats 3] [--no-imds] [--no-nocloud]
import { parseArgs } from 'node:util';
import { connect, type Socket } from 'node:net';
import { randomBytes } from 'node:crypto';
import { Worker } from 'node:worker_threads';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import pino from 'pino';
import { load, type Result } from './imds-load.ts';
import { execNft, RedirectKeeper } from '../src/redirect/keeper.ts';
import { makePodNode, startNodeDatasource, stopChild } from '../test/support/netns.ts';
import { signToken } from '../src/datasource/tokens.ts';
import { rm } from 'node:fs/promises';
import { benchPodsTree, launcherIp } from './imds-pods.ts';
import { quantile } from './stats.ts';
import { identityVerdict, pairOrder, type IdentitySamples } from './support/identity-compare.ts';
import { identityLookupCost, lookupLines } from './support/identity-lookup.ts';

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '30' },
    rate: { type: 'string', default: '1000' },
    vmis: { type: 'string', default: '500' },
    flood: { type: 'string', default: '1000' },
    'no-reference': { type: 'boolean', default: false },
    // The IMDS rows: identity and token paths; one VM flooding at this rate.
    'imds-flood': { type: 'string', default: '10000' },
    // VM 0's well-behaved rate in the allowance rows: its bucket's.
    'imds-allowance': { type: 'string', default: '100' },
    // Rows without and with the flood, each.
    'imds-repeats': { type: 'string', default: '3' },
    'no-imds': { type: 'boolean', default: false },
    'no-nocloud': { type: 'boolean', default: false },
    redirect: { type: 'boolean', default: false },
    // The identity rows: rounds of both servers, each row this long, each
    // server loaded at this rate (both at once: 2x this in all). Many short
    // rows rather than few long ones: the median over rounds is what is
    // judged, and a shared machine's drift spoils a long row as a whole.
    'identity-rounds': { type: 'string', default: '16' },
    'identity-seconds': { type: 'string', default: '3' },
    'identity-rate': { type: 'string', default: '500' },
    'no-identity': { type: 'boolean', default: false },
    // Only the identity rows.
    'identity-only': { type: 'boolean', default: false },
  },
});
const seconds = Number(values.seconds);
const rate = Number(values.rate);
const vmis = Number(values.vmis);
const repeats = Number(values['imds-repeats']);
const FILES = ['meta-data', 'user-data', 'vendor-data', 'network-config'];

async function startWorker(
  kind: 'vmseed' | 'bare' | 'bare-429' | 'bare-imds',
  key: Uint8Array,
  perSourceCap = false,
  podsDir?: string,
  launchers?: boolean,
): Promise<{ port: number; worker: Worker }> {
  const worker = new Worker(new URL('./imds-server-worker.ts', import.meta.url), {
    workerData: {
      kind,
      key,
      vmis,
      perSourceCap,
      ...(podsDir ? { podsDir } : {}),
      ...(launchers !== undefined ? { launchers } : {}),
    },
  });
  const port = await new Promise<number>((resolve, reject) => {
    worker.once('message', (m: { port: number }) => resolve(m.port));
    worker.once('error', reject);
  });
  return { port, worker };
}

// The worker's thread CPU time so far, in microseconds.
async function cpuOf(worker: Worker): Promise<number> {
  return new Promise((resolve) => {
    const answer = (m: { cpu?: { user: number; system: number } }) => {
      if (m.cpu === undefined) return;
      worker.off('message', answer);
      resolve(m.cpu.user + m.cpu.system);
    };
    worker.on('message', answer);
    worker.postMessage('cpu');
  });
}

function pct(sorted: Float64Array, p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

const key = new Uint8Array(randomBytes(32));
const paths: string[] = [];
for (let i = 0; i < vmis; i++)
  for (const f of FILES) paths.push(`/v1/${signToken(key, `uid-${i}`)}${i % 2 ? '/' : ''}${f}`);

const results: Result[] = [];
const only = values['identity-only'];
if (!values['no-nocloud'] && !only) {
  const { port, worker } = await startWorker('vmseed', key);
  await load('warm-up', `http://127.0.0.1:${port}`, paths, 1, rate); // JIT, token index, connections
  results.push(await load('vmseed datasource', `http://127.0.0.1:${port}`, paths, seconds, rate));
  await worker.terminate();
}
const flood = values['no-nocloud'] || only ? 0 : Number(values.flood);
if (flood > 0) {
  const { port, worker } = await startWorker('vmseed', key, true);
  const held: Socket[] = [];
  for (let i = 0; i < flood; i += 100) {
    held.push(
      ...(await Promise.all(
        Array.from(
          { length: Math.min(100, flood - i) },
          () =>
            new Promise<Socket>((resolve) => {
              const s = connect({ port, host: '127.0.0.1', localAddress: '127.0.0.1' });
              s.on('error', () => {});
              s.on('connect', () => {
                s.write('GET /v1/');
                resolve(s);
              });
              s.on('close', () => resolve(s));
            }),
        ),
      )),
    );
  }
  const from = { localAddress: '127.0.0.2', connections: 32 };
  await load('warm-up', `http://127.0.0.1:${port}`, paths, 1, rate, from);
  results.push(
    await load(
      `vmseed, ${flood} half-open from one other source`,
      `http://127.0.0.1:${port}`,
      paths,
      seconds,
      rate,
      from,
    ),
  );
  for (const s of held) s.destroy();
  await worker.terminate();
}
// IMDS's identity and token paths under each VMI's token path (one loopback
// client stands for every guest), with IMDS's guards at their defaults:
// 100/s and burst 100 per VMI. Then the other VMIs' latency with and
// without VM 0 flooding from a load generator of its own, against vmseed
// and (unless --no-reference) against the bare-imds reference in turn.
const floodLines: string[] = [];
if (!values['no-imds'] && !only) {
  const podsDir = await benchPodsTree(vmis);
  const { port, worker } = await startWorker('vmseed', key, false, podsDir);
  const origin = `http://127.0.0.1:${port}`;
  const MD = { Metadata: 'true' };
  const pathsOf = (i: number) => ['identity', 'token'].map((e) => `/v1/${signToken(key, `uid-${i}`)}/${e}`);
  const all = Array.from({ length: vmis }, (_, i) => pathsOf(i)).flat();
  const others = all.slice(2);
  await load('warm-up', origin, all, 1, rate, undefined, MD);
  results.push(await load(`vmseed IMDS identity+token, ${vmis} VMIs`, origin, all, seconds, rate, undefined, MD));
  const floodRate = Number(values['imds-flood']);
  // The load generator's pool size (imds-load.ts): one request in flight per connection.
  const FLOOD_CONNECTIONS = 64;
  // The others' load on a server while VM 0 sends at vmRate to vmOrigin.
  const othersBeside = async (
    name: string,
    vmName: string,
    serverOrigin: string,
    vmOrigin: string,
    vmRate = floodRate,
  ) => {
    const flooding = new Worker(new URL('./imds-load-worker.ts', import.meta.url), {
      workerData: {
        name: vmName,
        origin: vmOrigin,
        paths: pathsOf(0),
        seconds,
        rate: vmRate,
        headers: MD,
        maxInFlight: FLOOD_CONNECTIONS,
      },
    });
    const vmDone = new Promise<Result>((resolve, reject) => {
      flooding.once('error', reject);
      flooding.once('message', () => {
        flooding.once('message', resolve);
        flooding.postMessage('go');
      });
    });
    await new Promise((ready) => flooding.once('message', ready));
    const during = await load(name, serverOrigin, others, seconds, rate, undefined, MD);
    const vmResult = await vmDone;
    await flooding.terminate();
    return [during, vmResult] as const;
  };
  interface Subject {
    name: string;
    origin: string;
    worker: Worker;
    quiet: Result[];
    during: Result[];
    allowed: Result[];
    cpuQuiet: number;
    cpuFlood: number;
    cpuAllowance: number;
  }
  const subject = (name: string, subjectOrigin: string, w: Worker): Subject => ({
    name,
    origin: subjectOrigin,
    worker: w,
    quiet: [],
    during: [],
    allowed: [],
    cpuQuiet: 0,
    cpuFlood: 0,
    cpuAllowance: 0,
  });
  const subjects = [subject('vmseed', origin, worker)];
  if (!values['no-reference']) {
    const ref = await startWorker('bare-imds', key);
    const refOrigin = `http://127.0.0.1:${ref.port}`;
    await load('warm-up', refOrigin, all, 1, rate, undefined, MD);
    subjects.push(subject('bare-imds', refOrigin, ref.worker));
  }
  // The three kinds of rows take turns in a rotating order, so a drift of
  // the machine falls on each, and each kind runs against each server in
  // turn; each kind's p99 is over all its rows' requests together.
  const allowanceRate = Number(values['imds-allowance']);
  const kinds = ['quiet', 'flood', 'allowance'] as const;
  for (let r = 0; r < repeats; r++) {
    for (let k = 0; k < kinds.length; k++) {
      const kind = kinds[(k + r) % kinds.length];
      for (let n = 0; n < subjects.length; n++) {
        const sub = subjects[(n + r + k) % subjects.length];
        const on = sub.name === 'vmseed' ? '' : ` [${sub.name}]`;
        const before = await cpuOf(sub.worker);
        if (kind === 'flood') {
          const [d, f] = await othersBeside(
            `IMDS, ${vmis - 1} other VMIs, VM 0 flooding (${r + 1})${on}`,
            `IMDS, VM 0 flooding at ${floodRate}/s (${r + 1})${on}`,
            sub.origin,
            sub.origin,
          );
          sub.during.push(d);
          results.push(d, f);
          sub.cpuFlood += (await cpuOf(sub.worker)) - before;
        } else if (kind === 'allowance') {
          const [d, v] = await othersBeside(
            `IMDS, ${vmis - 1} other VMIs, VM 0 at ${allowanceRate}/s (${r + 1})${on}`,
            `IMDS, VM 0 at ${allowanceRate}/s, its allowance (${r + 1})${on}`,
            sub.origin,
            sub.origin,
            allowanceRate,
          );
          sub.allowed.push(d);
          results.push(d, v);
          sub.cpuAllowance += (await cpuOf(sub.worker)) - before;
        } else {
          const q = await load(
            `IMDS, ${vmis - 1} other VMIs, no flood (${r + 1})${on}`,
            sub.origin,
            others,
            seconds,
            rate,
            undefined,
            MD,
          );
          sub.quiet.push(q);
          results.push(q);
          sub.cpuQuiet += (await cpuOf(sub.worker)) - before;
        }
      }
    }
  }
  const floor = await startWorker('bare-429', key);
  const floorBefore = await cpuOf(floor.worker);
  const [duringFloor, floorFlood] = await othersBeside(
    `IMDS, ${vmis - 1} other VMIs, the flood sent to a bare 429 server (reference)`,
    `the same flood to a bare node:http answering 429`,
    origin,
    `http://127.0.0.1:${floor.port}`,
  );
  const floorCpu = (await cpuOf(floor.worker)) - floorBefore;
  await floor.worker.terminate();
  results.push(duringFloor, floorFlood);
  const pooled = (rs: Result[]) => {
    const all = new Float64Array(rs.reduce((n, r) => n + r.latenciesMs.length, 0));
    let at = 0;
    for (const r of rs) {
      all.set(r.latenciesMs, at);
      at += r.latenciesMs.length;
    }
    return pct(all.sort(), 99);
  };
  const p99 = (r: Result) => pct(r.latenciesMs.slice().sort(), 99);
  const ratios: number[] = [];
  for (const sub of subjects) {
    const { quiet, during, allowed } = sub;
    ratios.push(pooled(during) / pooled(quiet));
    floodLines.push(
      `${sub.name}: other VMIs' p99 with VM 0 flooding / without: ${(pooled(during) / pooled(quiet)).toFixed(2)}x (p99 ${pooled(quiet).toFixed(3)} → ${pooled(during).toFixed(3)} ms over ${repeats} rows each; per pair: ${during.map((d, i) => (p99(d) / p99(quiet[i])).toFixed(2)).join(', ')})`,
      `${sub.name}: other VMIs' p99 with VM 0 flooding / with VM 0 well behaved at its allowance: ${(pooled(during) / pooled(allowed)).toFixed(2)}x (VM 0 at ${allowanceRate}/s: p99 ${pooled(allowed).toFixed(3)} ms, ${(pooled(allowed) / pooled(quiet)).toFixed(2)}x the rows without VM 0)`,
    );
    // What VM 0 added to the server's thread (its CPU in those rows less
    // in the rows without VM 0), per second: flooding and at its allowance.
    const addedMsPerS = (cpu: number) => ((cpu - sub.cpuQuiet) / repeats / seconds / 1000).toFixed(1);
    floodLines.push(
      `${sub.name}: server thread CPU added: VM 0 flooding ${addedMsPerS(sub.cpuFlood)} ms/s, VM 0 at its allowance ${addedMsPerS(sub.cpuAllowance)} ms/s`,
    );
  }
  if (ratios.length > 1)
    floodLines.push(`vmseed's flood ratio over the bare-imds reference's: ${(ratios[0] / ratios[1]).toFixed(2)}x`);
  floodLines.push(
    `other VMIs' p99 with VM 0 flooding vmseed / with the same flood sent to a bare 429 server: ${(pooled(subjects[0].during) / p99(duringFloor)).toFixed(2)}x (the bare 429 server: ${(floorCpu / floorFlood.sent).toFixed(1)} µs CPU per request)`,
  );
  for (const sub of subjects) if (sub !== subjects[0]) await sub.worker.terminate();
  await worker.terminate();
  await rm(podsDir, { recursive: true, force: true });
}
// The identity checks' cost: the same server with the launcher pods known
// (each VMI's requests from its launcher pod's address: the case that is
// served) and without launcher knowledge (today's, local mode's), both the
// agent's AgentSeedDirectory, the same client (a pool per source address)
// and load. The two servers' rows of a round run at the same time, so that
// whatever else takes this machine's cores meanwhile weighs on both alike
// (a shared 2-core machine moves one row's CPU per request by ±30 % from
// the next); the one started first alternates (support/identity-compare.ts,
// which also judges the 5 % budget).
const identityLines: string[] = [];
if (!values['no-identity']) identityLines.push(...(await identityRows()));
if (!values['no-reference'] && !only) {
  const { port, worker } = await startWorker('bare', key);
  results.push(await load('bare node:http (reference)', `http://127.0.0.1:${port}`, ['/x'], seconds, rate));
  await worker.terminate();
}

if (values.redirect) {
  const env = await makePodNode();
  const ds = await startNodeDatasource(env, Buffer.from(key), 'uid-bench', 8081, { vmis });
  const keeper = new RedirectKeeper({
    spec: {
      table: 'vmseed',
      to: { host: env.nodeAddress, port: 8081 },
      podInterfaces: ['veth*'],
      metadata: { address: '169.254.169.254', port: 80 },
    },
    runner: execNft({ prefix: env.inNode([]) }),
    logger: pino({ level: 'silent' }),
  });
  try {
    await keeper.tick('start');
    if (!keeper.inPlace) throw new Error(`redirect not in place: ${keeper.lastError}`);
    for (const [name, origin] of [
      ['pod → node address (veth, no DNAT)', `http://${env.nodeAddress}:8081`],
      ['pod → 169.254.169.254 (veth + DNAT)', 'http://169.254.169.254'],
    ] as const) {
      const { stdout } = await promisify(execFile)(
        'ip',
        [
          'netns',
          'exec',
          env.pod,
          process.execPath,
          new URL('./imds-load-cli.ts', import.meta.url).pathname,
          name,
          origin,
          Buffer.from(key).toString('base64'),
          String(vmis),
          String(seconds),
          String(rate),
        ],
        { maxBuffer: 256 * 1024 * 1024 },
      );
      const r = JSON.parse(stdout) as Omit<Result, 'latenciesMs'> & { latenciesMs: number[] };
      results.push({ ...r, latenciesMs: Float64Array.from(r.latenciesMs) });
    }
  } finally {
    await keeper.stop().catch(() => {});
    await stopChild(ds);
    await env.remove();
  }
}

const ref = results.find((r) => r.name.startsWith('bare'));
const rows = results.map((r) => {
  const sorted = r.latenciesMs.slice().sort();
  const p99 = pct(sorted, 99);
  return {
    server: r.name,
    requests: r.sent,
    ok: r.ok,
    errors: r.errors,
    '429s': r.limited,
    'not sent': r.notSent,
    'req/s': (r.sent / r.wallSeconds).toFixed(0),
    'median ms': pct(sorted, 50).toFixed(3),
    'p99 ms': p99.toFixed(3),
    'max ms': sorted[sorted.length - 1].toFixed(3),
    'p99 vs ref': ref ? (p99 / pct(ref.latenciesMs.slice().sort(), 99)).toFixed(2) + 'x' : '-',
  };
});
const cols = (rows.length > 0 ? Object.keys(rows[0]) : []) as Array<keyof (typeof rows)[number]>;
const width = cols.map((c) => Math.max(c.length, ...rows.map((r) => String(r[c]).length)));
const line = (cells: string[]) => '| ' + cells.map((c, i) => c.padEnd(width[i])).join(' | ') + ' |';
console.log(
  `NoCloud HTTP datasource, loopback, ${rate} req/s target for ${seconds} s, ${vmis} VMIs x 4 files, node ${process.version}`,
);
console.log(line(cols));
console.log('|' + width.map((w) => '-'.repeat(w + 2)).join('|') + '|');
for (const r of rows) console.log(line(cols.map((c) => String(r[c]))));
for (const l of floodLines) console.log(l);
for (const l of identityLines) console.log(l);
if (results.some((r) => r.errors > 0)) process.exitCode = 1;

async function identityRows(): Promise<string[]> {
  const rounds = Number(values['identity-rounds']);
  const secs = Number(values['identity-seconds']);
  const identityRate = Number(values['identity-rate']);
  const podsDir = await benchPodsTree(vmis);
  const MD = { Metadata: 'true' };
  const servers = [
    { name: 'no launcher knowledge', ...(await startWorker('vmseed', key, false, podsDir, false)) },
    { name: 'identity checks', ...(await startWorker('vmseed', key, false, podsDir, true)) },
  ];
  const kinds = [
    {
      name: 'NoCloud files',
      perVmi: FILES.length,
      paths: Array.from({ length: vmis }, (_, i) => FILES.map((f) => `/v1/${signToken(key, `uid-${i}`)}/${f}`)).flat(),
      headers: undefined,
    },
    {
      name: 'IMDS identity+token',
      perVmi: 2,
      paths: Array.from({ length: vmis }, (_, i) =>
        ['identity', 'token'].map((e) => `/v1/${signToken(key, `uid-${i}`)}/${e}`),
      ).flat(),
      headers: MD,
    },
  ];
  // µs of server-thread CPU per request, per row, by kind then server.
  const perRequest = kinds.map(() => servers.map(() => [] as number[]));
  const totals = kinds.map(() => servers.map(() => ({ cpu: 0, requests: 0 })));
  const rowLines: string[] = [];
  const run = async (k: number, s: number, name: string, rowSecs: number) => {
    const kind = kinds[k];
    const server = servers[s];
    const sources = { of: (p: number) => launcherIp(Math.floor(p / kind.perVmi)), connections: 1 };
    const origin = `http://127.0.0.1:${server.port}`;
    const before = await cpuOf(server.worker);
    const r = await load(name, origin, kind.paths, rowSecs, identityRate, undefined, kind.headers, undefined, sources);
    const cpu = (await cpuOf(server.worker)) - before;
    return { r, cpu };
  };
  // Both servers' rows of one kind at once, started in `order`.
  const pair = (k: number, order: readonly number[], name: (s: number) => string, rowSecs: number) => {
    const rows: Array<Promise<{ r: Result; cpu: number }>> = [];
    for (const s of order) rows[s] = run(k, s, name(s), rowSecs);
    return Promise.all(rows);
  };
  for (let k = 0; k < kinds.length; k++) await pair(k, [0, 1], () => 'warm-up', 2);
  for (let round = 0; round < rounds; round++) {
    for (let k = 0; k < kinds.length; k++) {
      const order = pairOrder(round, k);
      const both = await pair(k, order, (s) => `${kinds[k].name}, ${servers[s].name} (${round + 1})`, secs);
      for (const s of order) {
        const { r, cpu } = both[s];
        // A row whose requests were not all answered 200 is no measure
        // of the case that is served.
        if (r.ok !== r.sent || r.errors > 0) results.push(r);
        perRequest[k][s].push(cpu / r.sent);
        totals[k][s].cpu += cpu;
        totals[k][s].requests += r.sent;
        const p99 = pct(r.latenciesMs.slice().sort(), 99);
        rowLines.push(
          `| ${round + 1} | ${kinds[k].name} | ${servers[s].name} | ${r.sent} | ${r.ok} | ${(cpu / 1000).toFixed(0)} | ${(cpu / r.sent).toFixed(1)} | ${p99.toFixed(3)} |`,
        );
      }
    }
  }
  await Promise.all(servers.map((s) => s.worker.terminate()));
  await rm(podsDir, { recursive: true, force: true });
  const out = [
    '',
    `Identity checks: ${rounds} rounds of ${secs} s rows at ${identityRate} req/s, the two servers' rows of a round at once, ${vmis} VMIs, each VMI's requests from its launcher IP (127.0.x.y); server thread CPU (process.threadCpuUsage)`,
    '| round | paths | server | requests | ok | server CPU ms | CPU µs/request | p99 ms |',
    '|---|---|---|---|---|---|---|---|',
    ...rowLines,
    '',
    '| paths | server | CPU µs/request median | p99 | total CPU / requests µs |',
    '|---|---|---|---|---|',
  ];
  const ratios: string[] = [];
  for (let k = 0; k < kinds.length; k++) {
    const med = perRequest[k].map((xs) => quantile(xs, 0.5));
    const p99s = perRequest[k].map((xs) => quantile(xs, 0.99));
    const tot = totals[k].map((t) => t.cpu / t.requests);
    for (let s = 0; s < servers.length; s++)
      out.push(
        `| ${kinds[k].name} | ${servers[s].name} | ${med[s].toFixed(1)} | ${p99s[s].toFixed(1)} | ${tot[s].toFixed(1)} |`,
      );
    ratios.push(
      `${kinds[k].name}: identity checks / none: median ${(med[1] / med[0]).toFixed(3)}x, p99 ${(p99s[1] / p99s[0]).toFixed(3)}x, total ${(tot[1] / tot[0]).toFixed(3)}x`,
    );
  }
  const samples: IdentitySamples[] = kinds.map((kind, k) => ({
    load: kind.name,
    none: perRequest[k][0],
    checked: perRequest[k][1],
  }));
  // The HTTP servers are gone: the lookup does not compete with them.
  const lookup = identityLookupCost(key, vmis, launcherIp);
  const lookupOut = samples.flatMap((x) => lookupLines(x.load, lookup, quantile(x.none, 0.5)));
  return [...out, '', ...ratios, '', ...identityVerdict(samples), ...lookupOut];
}
