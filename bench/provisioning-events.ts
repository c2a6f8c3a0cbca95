// cloud-init progress reports at 50 VMs booting at once, beside the seed
// fetches the datasource serves: are events lost, does the datasource slow
// down, and how soon after the final event are the Event and the status
// page's state there.
//
// The node side (bench/provisioning-worker.ts: the datasource listener, its
// progress receiver, the agent's ProvisioningTracker) runs in a worker
// thread. Each simulated VM has its own source address (127.0.0.<10+i>, as
// each launcher pod has its own IP) and:
//  - fetches its four seed files every second (the seed load; each request
//    timed from the moment it was due);
//  - in the "with events" rows, posts one boot's events as cloud-init's
//    WebHookHandler does: one POST at a time, each on a connection of its
//    own, the 112 events that Debian 12's cloud-init makes for a boot
//    (test/fixtures/cloud-init-events/boot-success.json, from cloud-init's
//    own reporting code), 20 ms apart within a stage and 3 s between stages
//    (~13 s a boot; all 50 start within the first second).
// The events are sent from a worker thread of their own, so their sending
// does not delay the seed load's clock. A warm-up row (not counted) comes
// first; then rows alternate without / with events, --rounds times each.
//
//   npm run bench:provisioning-events -- [--vms 50] [--seconds 16] [--rounds 2]
import { parseArgs } from 'node:util';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import { quantile } from './stats.ts';
import { DatasourceKeyring, signToken } from '../src/http/datasource-tokens.ts';
import { reportToken } from '../src/http/report-token.ts';

const { values } = parseArgs({
  options: {
    vms: { type: 'string', default: '50' },
    seconds: { type: 'string', default: '16' },
    rounds: { type: 'string', default: '2' },
  },
});
const VMS = Number(values.vms);
const SECONDS = Number(values.seconds);
const ROUNDS = Number(values.rounds);
const FILES = ['network-config', 'meta-data', 'user-data', 'vendor-data'];
const BOOT = JSON.parse(
  readFileSync(new URL('../test/fixtures/cloud-init-events/boot-success.json', import.meta.url), 'utf8'),
) as Array<{ name: string; timestamp: number }>;
const wall = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const sender = !isMainThread ? (workerData as { key: Uint8Array; port: number }) : undefined;
const key = sender ? sender.key : new Uint8Array(randomBytes(32));
const ring = new DatasourceKeyring([key]);
const worker = sender
  ? undefined
  : new Worker(new URL('./provisioning-worker.ts', import.meta.url), { workerData: { key, vmis: VMS } });
const port =
  sender?.port ??
  (await new Promise<number>((resolve, reject) => {
    worker!.once('message', (m: { port: number }) => resolve(m.port));
    worker!.once('error', reject);
  }));
const agents = Array.from(
  { length: VMS },
  (_, i) => new Agent({ keepAlive: true, maxSockets: 2, localAddress: `127.0.0.${10 + i}` }),
);
// cloud-init's url_helper.readurl opens a requests.Session per call and
// closes it after, so its webhook handler posts each event on a connection
// of its own (22.4 and 25.1 alike): the events do the same here.
const eventAgents = Array.from(
  { length: VMS },
  (_, i) => new Agent({ keepAlive: false, localAddress: `127.0.0.${10 + i}` }),
);

function call(i: number, method: string, path: string, body?: string): Promise<number> {
  return new Promise((resolve) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        method,
        path,
        agent: body === undefined ? agents[i] : eventAgents[i],
        headers: body ? { 'Content-Length': Buffer.byteLength(body) } : {},
      },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      },
    );
    req.on('error', () => resolve(0));
    req.end(body);
  });
}

// Every VM's four files once a second, each timed from when it was due.
async function seedLoad(until: number, latencies: number[]): Promise<void> {
  const one = async (i: number) => {
    const base = `/v1/${signToken(key, `uid-${i}`)}/`;
    let due = performance.now() + Math.random() * 1000;
    while (due < until) {
      await sleep(Math.max(0, due - performance.now()));
      for (const f of FILES) {
        const status = await call(i, 'GET', base + f);
        if (status === 200) latencies.push(performance.now() - due);
      }
      due += 1000;
    }
  };
  await Promise.all(Array.from({ length: VMS }, (_, i) => one(i)));
}

interface Boot {
  lost: number;
  sent: number;
  finalSentAt: Map<string, number>;
}

async function boots(): Promise<Boot> {
  const out: Boot = { lost: 0, sent: 0, finalSentAt: new Map() };
  const one = async (i: number) => {
    await sleep(Math.random() * 1000);
    const path = `/v1/${reportToken(ring, `uid-${i}`)}/cloud-init-events`;
    for (let n = 0; n < BOOT.length; n++) {
      const e = { ...BOOT[n], timestamp: Date.now() / 1000 };
      const stageStart = n > 0 && !e.name.includes('/') && (e as { event_type?: string }).event_type === 'start';
      await sleep(stageStart ? 3000 : 20);
      const last = n === BOOT.length - 1;
      if (last) out.finalSentAt.set(`vm-${i}`, wall());
      out.sent++;
      if ((await call(i, 'POST', path, JSON.stringify(e))) !== 200) out.lost++;
    }
  };
  await Promise.all(Array.from({ length: VMS }, (_, i) => one(i)));
  return out;
}

// The boots, run in a sender thread.
async function bootsElsewhere(): Promise<Boot> {
  const w = new Worker(new URL(import.meta.url), { workerData: { key, port }, argv: process.argv.slice(2) });
  const r = await new Promise<{ lost: number; sent: number; finalSentAt: Array<[string, number]> }>(
    (resolve, reject) => {
      w.once('message', resolve);
      w.once('error', reject);
    },
  );
  await w.terminate();
  return { ...r, finalSentAt: new Map(r.finalSentAt) };
}

async function collect(): Promise<{
  eventAt: Record<string, number>;
  statusAt: Record<string, number>;
  accepted: number;
  refused: number;
  busyMs: number;
}> {
  worker!.postMessage('collect');
  return new Promise((resolve) => worker!.once('message', resolve));
}

if (sender) {
  const b = await boots();
  parentPort!.postMessage({ lost: b.lost, sent: b.sent, finalSentAt: [...b.finalSentAt] });
  for (const a of agents) a.destroy();
} else await main();

async function main(): Promise<void> {
  const rows: string[] = [];
  const withoutAll: number[] = [];
  const withAll: number[] = [];
  const toEvent: number[] = [];
  const toStatus: number[] = [];
  let lostTotal = 0;
  let sentTotal = 0;
  let acceptedBefore = 0;
  const busyWith: number[] = [];
  const busyWithout: number[] = [];
  await seedLoad(performance.now() + 3000, []);
  await collect();
  for (let round = 0; round < ROUNDS; round++) {
    for (const events of [false, true]) {
      const latencies: number[] = [];
      const until = performance.now() + SECONDS * 1000;
      const [, boot] = await Promise.all([
        seedLoad(until, latencies),
        events ? bootsElsewhere() : Promise.resolve(undefined),
      ]);
      const c = await collect();
      const accepted = c.accepted - acceptedBefore;
      acceptedBefore = c.accepted;
      (events ? withAll : withoutAll).push(...latencies);
      let extra = '';
      if (boot) {
        lostTotal += boot.lost;
        sentTotal += boot.sent;
        for (const [vm, sent] of boot.finalSentAt) {
          if (c.eventAt[vm] !== undefined) toEvent.push(c.eventAt[vm] - sent);
          if (c.statusAt[vm] !== undefined) toStatus.push(c.statusAt[vm] - sent);
        }
        extra = ` | events sent ${boot.sent}, accepted ${accepted}, lost ${boot.lost}, Events ${Object.keys(c.eventAt).length}/${VMS}`;
      }
      (events ? busyWith : busyWithout).push(c.busyMs);
      rows.push(
        `| ${round + 1} | ${events ? 'with events' : 'seeds only '} | ${latencies.length} | ${quantile(latencies, 0.5).toFixed(2)} | ${quantile(latencies, 0.99).toFixed(2)} | ${c.busyMs.toFixed(0)}${extra} |`,
      );
      console.log(rows.at(-1));
    }
  }
  const p99Without = quantile(withoutAll, 0.99);
  const p99With = quantile(withAll, 0.99);
  console.log(`\n${VMS} VMs, ${SECONDS} s rows, ${ROUNDS} rounds; seed fetches: ${VMS * 4}/s`);
  console.log('| round | load | seed requests | p50 ms | p99 ms | server busy ms | events |');
  console.log(rows.join('\n'));
  console.log(
    `\nseed fetch p99: ${p99Without.toFixed(2)} ms without events, ${p99With.toFixed(2)} ms with (${(p99With / p99Without).toFixed(2)}x)`,
  );
  console.log(`events: ${sentTotal} sent, ${lostTotal} lost`);
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  const perEventUs = ((sum(busyWith) - sum(busyWithout)) / Math.max(1, sentTotal)) * 1000;
  const perSeedUs = (sum(busyWithout) / Math.max(1, withoutAll.length)) * 1000;
  console.log(
    `server event loop busy: ${perSeedUs.toFixed(0)} µs per seed request, ${perEventUs.toFixed(0)} µs more per event`,
  );
  console.log(
    `final event sent -> Event recorded: median ${quantile(toEvent, 0.5).toFixed(2)} ms, p99 ${quantile(toEvent, 0.99).toFixed(2)} ms (${toEvent.length} boots)`,
  );
  console.log(
    `final event sent -> status "succeeded": median ${quantile(toStatus, 0.5).toFixed(2)} ms, p99 ${quantile(toStatus, 0.99).toFixed(2)} ms`,
  );
  for (const a of agents) a.destroy();
  await worker!.terminate();
}
