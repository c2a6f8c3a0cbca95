// npm run bench:hostile [-- --iterations 20 --no-agent]
//
// The hostile corpus (test/hostile/corpus.ts) beside a normal VMI, two ways:
//   render path, in this process: renderSeed + buildSeedImage as a
//     reconcile runs them, with the referenced objects in memory (so every
//     await resolves at once and a whole render is one event-loop turn: the
//     worst case for blocking). Time to the answer (median, p99) and the
//     worst event-loop block, seen by perf_hooks' monitorEventLoopDelay
//     (1 ms resolution) while the case runs; once with every step inline
//     (what the agent did before its render pool), once with the agent's
//     render pool (src/agent/render-pool.ts: documents of 64 KiB and more
//     are parsed, merged and serialised on a worker thread);
//   real agent: `bin/vmseed agent --local` with the DaemonSet's NODE_OPTIONS,
//     a baseline VMI seeded first, then the case's manifest dropped in: time
//     from the write to the answer on /status.json (includes the directory
//     watcher's latency and 20 ms polling), and the agent's peak RSS
//     (VmHWM) after it; one fresh agent per case (the baseline must still be
//     seeded after). Last row: every hostile case at once.
// On a shared machine the median and p99 move with the load; the minimum is
// the floor of what the work costs.
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import type { SecretObject, VmiObject } from '../src/api/objects.ts';
import { MemoryResolver } from '../src/cloudinit/refs/memory-resolver.ts';
import { renderSeed, type RenderOptions } from '../src/cloudinit/render.ts';
import { DEFAULT_MAX_NETWORK_DATA_BYTES, DEFAULT_MAX_USER_DATA_BYTES } from '../src/cloudinit/limits.ts';
import { buildSeedImage } from '../src/disk/seed-image.ts';
import { RenderPool } from '../src/agent/render-pool.ts';
import { INLINE_OFFLOAD, type Offload } from '../src/cloudinit/pure-ops.ts';
import { VmseedError } from '../src/errors.ts';
import {
  HOSTILE_CASES,
  NAMESPACE,
  caseManifest,
  normalVmi,
  secretObject,
  vmiObject,
  type HostileCase,
} from '../test/hostile/corpus.ts';
import { freshDir, put, startLocalAgent, waitUntil } from '../test/hostile/agent-run.ts';
import { quantile } from './stats.ts';

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '20' },
    'no-agent': { type: 'boolean', default: false },
    only: { type: 'string' },
  },
});
const ITERATIONS = Number(values.iterations);

const OPTIONS: RenderOptions = {
  kubevirtVolumes: 'own',
  maxUserDataBytes: DEFAULT_MAX_USER_DATA_BYTES,
  maxNetworkDataBytes: DEFAULT_MAX_NETWORK_DATA_BYTES,
};

const NORMAL: HostileCase = {
  id: 'normal',
  what: 'a normal VMI',
  annotation: 'userData: |\n  #cloud-config\n  hostname: normal\n',
  expect: { state: 'ready' },
};

interface RenderRow {
  answer: string;
  min: number;
  median: number;
  p99: number;
  worstBlock: number;
  // CPU time of this thread per render (median): what the render costs the
  // event loop whatever the machine's load, unlike the loop monitor.
  mainCpu: number;
}

async function renderCase(c: HostileCase, offload: Offload): Promise<RenderRow> {
  const vmi = vmiObject(c.id.replace(/[^a-z0-9-]/g, '-'), c.annotation ?? '', c.spec ?? { domain: {} }) as VmiObject;
  vmi.metadata.uid = '6a1f3c3e-4e57-4d43-9d0c-2d6f0f2a9b10';
  const refs = new MemoryResolver({
    secrets: (c.secrets ?? []).map((s) => secretObject(s.name, s.data) as SecretObject),
  });
  const once = async (): Promise<string> => {
    try {
      const out = await renderSeed(vmi, refs, { ...OPTIONS, offload });
      if (out.kind === 'seed') buildSeedImage(out.seed, new Date(0));
      return out.kind === 'seed' ? 'seed' : 'skip';
    } catch (e) {
      return e instanceof VmseedError ? e.code : `not a VmseedError: ${String(e)}`;
    }
  };
  await once(); // warm up (JIT, first-time allocations)
  const times: number[] = [];
  const cpu: number[] = [];
  const h = monitorEventLoopDelay({ resolution: 1 });
  let answer = '';
  h.enable();
  for (let i = 0; i < ITERATIONS; i++) {
    // Let the monitor's timer run between renders, so each block is seen alone.
    await sleep(3);
    const t0 = performance.now();
    const c0 = process.threadCpuUsage();
    answer = await once();
    const c1 = process.threadCpuUsage(c0);
    times.push(performance.now() - t0);
    cpu.push((c1.user + c1.system) / 1000);
  }
  await sleep(3);
  h.disable();
  // The monitor reports how late its 1 ms timer fired: a block plus up to
  // the resolution.
  return {
    answer,
    min: Math.min(...times),
    median: quantile(times, 0.5),
    p99: quantile(times, 0.99),
    worstBlock: Math.max(0, h.max / 1e6 - 1),
    mainCpu: quantile(cpu, 0.5),
  };
}

interface AgentRow {
  answer: string;
  ms: number;
  peakMiB: number;
}

async function agentCase(cases: HostileCase[], work: string): Promise<AgentRow> {
  const manifests = await freshDir(join(work, 'manifests'));
  const state = await freshDir(join(work, 'state'));
  await put(join(manifests, 'baseline.json'), JSON.stringify(normalVmi('baseline')));
  const agent = await startLocalAgent(manifests, state);
  try {
    const find = async (name: string) =>
      (await agent.status()).vmis.find((v) => v.namespace === NAMESPACE && v.name === name);
    await waitUntil('baseline seeded', async () => (await find('baseline'))?.state === 'ready', 30_000);
    const t0 = performance.now();
    for (const c of cases) await put(join(manifests, `${c.id}.yaml`), caseManifest(c));
    let answer = '';
    await waitUntil(
      'answered',
      async () => {
        const all = (await agent.status()).vmis;
        const done = cases.every((c) => {
          const v = all.find((x) => x.name === c.id);
          return (
            v &&
            (v.state === 'ready' || v.state === 'warning' || (v.state === 'error' && v.lastError?.kind === 'terminal'))
          );
        });
        if (done)
          answer =
            cases.length === 1 ? (all.find((x) => x.name === cases[0].id)!.lastError?.code ?? 'seed') : 'all answered';
        return done;
      },
      120_000,
    );
    const ms = performance.now() - t0;
    if ((await find('baseline'))?.state !== 'ready') throw new Error('the baseline VMI lost its seed');
    return { answer, ms, peakMiB: agent.peakRss() / 2 ** 20 };
  } finally {
    await agent.stop();
  }
}

const f = (n: number, d = 1) => n.toFixed(d);
const rows: string[][] = [];
const work = await mkdtemp(join(tmpdir(), 'vmseed-bench-hostile-'));
const pool = new RenderPool();
let worst = { inline: 0, pool: 0, inlineCpu: 0, poolCpu: 0 };
try {
  const only = values.only?.split(',');
  for (const c of [NORMAL, ...HOSTILE_CASES].filter((x) => !only || only.includes(x.id))) {
    const r = await renderCase(c, INLINE_OFFLOAD);
    const p = await renderCase(c, pool);
    const expected = c.expect.state === 'ready' ? 'seed' : c.expect.code;
    if (r.answer !== expected) throw new Error(`${c.id}: expected ${expected}, got ${r.answer}`);
    if (p.answer !== expected) throw new Error(`${c.id} (render pool): expected ${expected}, got ${p.answer}`);
    worst = {
      inline: Math.max(worst.inline, r.worstBlock),
      pool: Math.max(worst.pool, p.worstBlock),
      inlineCpu: Math.max(worst.inlineCpu, r.mainCpu),
      poolCpu: Math.max(worst.poolCpu, p.mainCpu),
    };
    let agentCols = ['-', '-'];
    if (!values['no-agent']) {
      const a = await agentCase([c], work);
      agentCols = [f(a.ms, 0), f(a.peakMiB)];
    }
    rows.push([
      c.id,
      r.answer,
      f(r.min, 2),
      f(r.median, 2),
      f(r.p99, 2),
      f(r.mainCpu),
      f(r.worstBlock),
      f(p.median, 2),
      f(p.mainCpu),
      f(p.worstBlock),
      ...agentCols,
    ]);
    process.stderr.write('.');
  }
  rows.push([
    'worst of all cases',
    '-',
    '-',
    '-',
    '-',
    f(worst.inlineCpu),
    f(worst.inline),
    '-',
    f(worst.poolCpu),
    f(worst.pool),
    '-',
    '-',
  ]);
  if (!values['no-agent']) {
    const a = await agentCase([...HOSTILE_CASES], work);
    rows.push([
      `all ${HOSTILE_CASES.length} at once`,
      a.answer,
      '-',
      '-',
      '-',
      '-',
      '-',
      '-',
      '-',
      '-',
      f(a.ms, 0),
      f(a.peakMiB),
    ]);
  }
} finally {
  await pool.close();
  await rm(work, { recursive: true, force: true });
}
process.stderr.write('\n');

const header = [
  'case',
  'answer',
  'inline: min ms',
  'inline: median ms',
  'inline: p99 ms',
  'inline: main-thread CPU ms',
  'inline: worst loop block ms',
  'pool: median ms',
  'pool: main-thread CPU ms',
  'pool: worst loop block ms',
  'agent: write→answer ms',
  'agent peak RSS MiB',
];
const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
const line = (cols: string[]) =>
  `| ${cols.map((c, i) => (i < 2 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join(' | ')} |`;
console.log(
  `bench:hostile — ${ITERATIONS} renders per case in-process (${process.version}), every step inline and with the render pool (${pool.offloaded} steps on its worker); agent: bin/vmseed --local with the DaemonSet's NODE_OPTIONS, one fresh agent per row`,
);
console.log(line(header));
console.log(`|${widths.map((w, i) => (i < 2 ? '-'.repeat(w + 2) : `${'-'.repeat(w + 1)}:`)).join('|')}|`);
for (const r of rows) console.log(line(r));
