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
//   npm run bench:imds -- [--seconds 30] [--rate 1000] [--flood 1000] [--no-reference]
import { parseArgs } from 'node:util';
import { connect, type Socket } from 'node:net';
import { randomBytes } from 'node:crypto';
import { Worker } from 'node:worker_threads';
import { Pool } from 'undici';
import { signToken } from '../src/http/datasource-tokens.ts';

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '30' },
    rate: { type: 'string', default: '1000' },
    vmis: { type: 'string', default: '500' },
    flood: { type: 'string', default: '1000' },
    'no-reference': { type: 'boolean', default: false },
  },
});
const seconds = Number(values.seconds);
const rate = Number(values.rate);
const vmis = Number(values.vmis);
const FILES = ['meta-data', 'user-data', 'vendor-data', 'network-config'];

interface Result {
  name: string;
  sent: number;
  ok: number;
  errors: number;
  wallSeconds: number;
  latenciesMs: Float64Array;
}

async function startWorker(kind: 'vmseed' | 'bare', key: Uint8Array, perSourceCap = false): Promise<{ port: number; worker: Worker }> {
  const worker = new Worker(new URL('./imds-server-worker.ts', import.meta.url), { workerData: { kind, key, vmis, perSourceCap } });
  const port = await new Promise<number>((resolve, reject) => {
    worker.once('message', (m: { port: number }) => resolve(m.port));
    worker.once('error', reject);
  });
  return { port, worker };
}

async function load(name: string, port: number, paths: string[], secs = seconds, from?: { localAddress: string; connections: number }): Promise<Result> {
  const pool = new Pool(`http://127.0.0.1:${port}`, { connections: from?.connections ?? 64, pipelining: 1, ...(from ? { localAddress: from.localAddress } : {}) });
  const total = Math.round(secs * rate);
  const latencies = new Float64Array(total);
  let sent = 0;
  let ok = 0;
  let errors = 0;
  let done = 0;
  const start = performance.now();
  await new Promise<void>((resolveAll) => {
    const fire = (i: number) => {
      const due = start + (i * 1000) / rate;
      pool
        .request({ path: paths[i % paths.length], method: 'GET' })
        .then(async (res) => {
          await res.body.arrayBuffer();
          if (res.statusCode === 200) ok++;
          else errors++;
        })
        .catch(() => errors++)
        .finally(() => {
          latencies[i] = performance.now() - due;
          if (++done === total) resolveAll();
        });
    };
    const tick = () => {
      const due = Math.min(total, Math.floor(((performance.now() - start) * rate) / 1000) + 1);
      while (sent < due) fire(sent++);
      if (sent < total) setTimeout(tick, 1);
    };
    tick();
  });
  const wallSeconds = (performance.now() - start) / 1000;
  await pool.close();
  return { name, sent, ok, errors, wallSeconds, latenciesMs: latencies };
}

function pct(sorted: Float64Array, p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

const key = new Uint8Array(randomBytes(32));
const paths: string[] = [];
for (let i = 0; i < vmis; i++) for (const f of FILES) paths.push(`/v1/${signToken(key, `uid-${i}`)}${i % 2 ? '/' : ''}${f}`);

const results: Result[] = [];
{
  const { port, worker } = await startWorker('vmseed', key);
  await load('warm-up', port, paths, 1); // JIT, token index, connections
  results.push(await load('vmseed datasource', port, paths));
  await worker.terminate();
}
const flood = Number(values.flood);
if (flood > 0) {
  const { port, worker } = await startWorker('vmseed', key, true);
  const held: Socket[] = [];
  for (let i = 0; i < flood; i += 100) {
    held.push(...(await Promise.all(Array.from({ length: Math.min(100, flood - i) }, () => new Promise<Socket>((resolve) => {
      const s = connect({ port, host: '127.0.0.1', localAddress: '127.0.0.1' });
      s.on('error', () => {});
      s.on('connect', () => { s.write('GET /v1/'); resolve(s); });
      s.on('close', () => resolve(s));
    })))));
  }
  const from = { localAddress: '127.0.0.2', connections: 32 };
  await load('warm-up', port, paths, 1, from);
  results.push(await load(`vmseed, ${flood} half-open from one other source`, port, paths, seconds, from));
  for (const s of held) s.destroy();
  await worker.terminate();
}
if (!values['no-reference']) {
  const { port, worker } = await startWorker('bare', key);
  results.push(await load('bare node:http (reference)', port, ['/x']));
  await worker.terminate();
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
    'req/s': (r.sent / r.wallSeconds).toFixed(0),
    'median ms': pct(sorted, 50).toFixed(3),
    'p99 ms': p99.toFixed(3),
    'max ms': sorted[sorted.length - 1].toFixed(3),
    'p99 vs ref': ref ? (p99 / pct(ref.latenciesMs.slice().sort(), 99)).toFixed(2) + 'x' : '-',
  };
});
const cols = Object.keys(rows[0]) as Array<keyof (typeof rows)[number]>;
const width = cols.map((c) => Math.max(c.length, ...rows.map((r) => String(r[c]).length)));
const line = (cells: string[]) => '| ' + cells.map((c, i) => c.padEnd(width[i])).join(' | ') + ' |';
console.log(`NoCloud HTTP datasource, loopback, ${rate} req/s target for ${seconds} s, ${vmis} VMIs x 4 files, node ${process.version}`);
console.log(line(cols));
console.log('|' + width.map((w) => '-'.repeat(w + 2)).join('|') + '|');
for (const r of rows) console.log(line(cols.map((c) => String(r[c]))));
if (results.some((r) => r.errors > 0)) process.exitCode = 1;
