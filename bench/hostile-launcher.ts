// npm run bench:hostile-launcher [-- --vmis 1000 --launchers 8 --seconds 30 --only flood]
//
// The agent's memory and liveness with hostile launchers beside normal VMIs
// (test/hostile/launcher-attack.ts sets the node up): the agent as
// manifests/daemonset.yaml runs it (its args, NODE_OPTIONS and env, uid 107
// with group 0, no capabilities, the pods directory at /pods), the fake API
// server serving --vmis normal VMIs of the node and --launchers hostile
// VMIs whose launcher sockets are served by a daemon running one attack.
// One fresh agent per attack, plus a baseline with no hostile launcher:
//   cold start: spawn → every normal VMI's image on disk (the hostile
//     launchers attack from the start);
//   then --seconds of attack, during which /healthz is asked every 200 ms
//     from this process (latency median, p99, max; failures with a 2 s
//     timeout, the DaemonSet probe's), and a new normal VMI is added every
//     second (event → image on disk, median and worst, and how many were
//     seeded within 60 s after the window);
// The normal VMIs have no launcher pod on the node (status.activePods
// empty): their images are written, then their injection is retried with
// backoff (LAUNCHER_POD_UNKNOWN) until KubeVirt names one, so the agent's
// queue carries those retries in every phase, the baseline included, and
// the libvirt traffic is the hostile launchers' alone.
//   VmHWM of the agent at the end, the libvirt panel of /status.json (cuts
//     by reason, budget in use), and whether the agent is still running.
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { ATTACKS, ATTACK_WHAT, probeHealthz, startHostileNode, type Attack } from '../test/hostile/launcher-attack.ts';
import { quantile } from './stats.ts';

const { values } = parseArgs({
  options: {
    vmis: { type: 'string', default: '1000' },
    launchers: { type: 'string', default: '8' },
    seconds: { type: 'string', default: '30' },
    only: { type: 'string' },
  },
});
const VMIS = Number(values.vmis);
const LAUNCHERS = Number(values.launchers);
const SECONDS = Number(values.seconds);
const MiB = 1024 * 1024;
// The agent container's memory limit in manifests/daemonset.yaml.
const LIMIT_MIB = 256;

interface Row {
  attack: string;
  coldS: number;
  hwmMiB: number;
  healthz: string;
  healthzFailed: number;
  seeds: string;
  cuts: string;
  // One message per cut reason, as the status page shows it.
  lastCuts: string[];
  budget: string;
  alive: boolean;
}

async function phase(attack: Attack | undefined): Promise<Row> {
  const node = await startHostileNode({ normal: VMIS, launchers: LAUNCHERS, attack });
  try {
    const t0 = performance.now();
    const probes: Array<{ ms: number; ok: boolean }> = [];
    let probing = true;
    const prober = (async () => {
      while (probing) {
        probes.push(await probeHealthz(node.healthz, 2_000));
        await sleep(200);
      }
    })();
    while ((await node.seeded()) < VMIS) {
      if (performance.now() - t0 > 120_000) throw new Error(`cold start: not all ${VMIS} seeded after 120 s`);
      await sleep(100);
    }
    const coldS = (performance.now() - t0) / 1000;
    // New VMIs during the attack, one a second; each is timed from its
    // watch event to its image on disk (polled every 50 ms), and given up
    // to 60 s after the window.
    const latencies: number[] = [];
    const pending: Array<{ start: number; seeded: () => Promise<boolean> }> = [];
    const poll = async () => {
      for (const p of [...pending])
        if (await p.seeded()) {
          latencies.push(performance.now() - p.start);
          pending.splice(pending.indexOf(p), 1);
        }
    };
    const end = performance.now() + SECONDS * 1000;
    let next = performance.now();
    for (let i = 0; performance.now() < end;) {
      if (performance.now() >= next) {
        pending.push({ start: performance.now(), seeded: node.addVmi(`during-${i++}`) });
        next += 1_000;
      }
      await poll();
      await sleep(50);
    }
    const grace = performance.now() + 60_000;
    while (pending.length > 0 && performance.now() < grace) {
      await poll();
      await sleep(50);
    }
    const missing = pending.length;
    probing = false;
    await prober;
    const alive = node.agent.child.exitCode === null && node.agent.child.signalCode === null;
    const { hwmBytes } = node.peak();
    const status = await node.status().catch(() => undefined);
    const lv = status?.libvirt;
    const cuts: Record<string, number> = {};
    const lastCuts = new Map<string, string>();
    for (const c of (lv?.connections ?? []) as Array<{
      cuts?: Record<string, number>;
      lastCut?: { reason: string; message: string };
    }>) {
      for (const [k, v] of Object.entries(c.cuts ?? {})) cuts[k] = (cuts[k] ?? 0) + v;
      if (c.lastCut) lastCuts.set(c.lastCut.reason, c.lastCut.message);
    }
    const okMs = probes.filter((p) => p.ok).map((p) => p.ms);
    return {
      attack: attack ?? 'none (baseline)',
      coldS,
      hwmMiB: hwmBytes / MiB,
      healthz: okMs.length
        ? `${quantile(okMs, 0.5).toFixed(1)} / ${quantile(okMs, 0.99).toFixed(1)} / ${Math.max(...okMs).toFixed(1)} ms (n=${probes.length})`
        : 'none answered',
      healthzFailed: probes.length - okMs.length,
      seeds: `${latencies.length}/${latencies.length + missing}, ${latencies.length ? `${quantile(latencies, 0.5).toFixed(0)} / ${Math.max(...latencies).toFixed(0)} ms` : '-'}`,
      cuts:
        Object.entries(cuts)
          .map(([k, v]) => `${k} ${v}`)
          .join(', ') || '-',
      lastCuts: [...lastCuts].map(([k, m]) => `${k}: ${m}`),
      budget: lv ? `${(lv.memoryBudget.used / MiB).toFixed(1)}/${(lv.memoryBudget.limit / MiB).toFixed(0)} MiB` : '-',
      alive,
    };
  } finally {
    await node.stop();
  }
}

const attacks: Array<Attack | undefined> = [undefined, ...ATTACKS].filter(
  (a) => values.only === undefined || values.only === (a ?? 'none'),
);
const rows: Row[] = [];
for (const a of attacks) {
  process.stderr.write(`${a ?? 'baseline'}...\n`);
  rows.push(await phase(a));
}
console.log(
  `vmseed hostile-launcher benchmark: ${VMIS} normal VMIs, ${LAUNCHERS} hostile launchers per attack, ${SECONDS} s of attack after the cold start, Node ${process.version}`,
);
console.log(
  "agent: manifests/daemonset.yaml's args, env and NODE_OPTIONS, uid 107 + group 0, no capabilities, compile cache warmed as 107",
);
for (const a of ATTACKS) console.log(`  ${a}: ${ATTACK_WHAT[a]}`);
const head = [
  'attack',
  'cold start',
  'VmHWM',
  '/healthz median / p99 / max',
  'failed',
  'new VMIs seeded, median / max',
  'cuts',
  'budget used',
  'up',
];
const table = rows.map((r) => [
  r.attack,
  `${r.coldS.toFixed(1)} s`,
  `${r.hwmMiB.toFixed(1)} MiB${r.hwmMiB > LIMIT_MIB ? ' (over the limit)' : ''}`,
  r.healthz,
  String(r.healthzFailed),
  r.seeds,
  r.cuts,
  r.budget,
  r.alive ? 'yes' : 'NO',
]);
console.log(`| ${head.join(' | ')} |`);
console.log(`|${head.map(() => '---').join('|')}|`);
for (const r of table) console.log(`| ${r.join(' | ')} |`);
for (const r of rows) for (const m of r.lastCuts) console.log(`${r.attack}, last cut: ${m}`);
