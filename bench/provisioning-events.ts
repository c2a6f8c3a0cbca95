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
// does not delay the seed load's clock. That thread is started once, before
// the warm-up, and waits idle between its rows: starting a thread (an
// isolate, this module compiled again) inside a row would weigh on that
// row's seed fetches and is no part of what the guests do.
//
// The reference (bench/provisioning-bare-worker.ts, unless --no-reference)
// is a bare node:http server that serves a fixed body and drops the events:
// the same load against it, in the same process and rounds, shows what the
// events cost on this machine whatever the server does with them. Each
// round runs, for each server in turn (the order rotating), a row without
// events and a row with them; a warm-up (not counted) comes first.
//
// The identity pair (vmseed over the agent's directory with the launcher
// pods known, and without) has rounds of its own, more of them than the
// others: the pair's two rows of a round at once, each server with the
// same load, the one started first alternating (support/identity-compare.ts,
// which judges the 5 % budget on the median across rounds of each row's
// server CPU per request).
//
//   npm run bench:provisioning-events -- [--vms 50] [--seconds 16] [--rounds 2] [--no-reference]
//                                        [--identity-rounds 8] [--identity-seconds 18] [--no-identity] [--identity-only]
import { parseArgs } from 'node:util';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { connect } from 'node:net';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import { quantile } from './stats.ts';
import { identityVerdict, pairOrder } from './support/identity-compare.ts';
import { identityLookupCost, lookupLines } from './support/identity-lookup.ts';
import { DatasourceKeyring, signToken } from '../src/datasource/tokens.ts';
import { reportToken } from '../src/datasource/reports/report-token.ts';

const { values } = parseArgs({
  options: {
    vms: { type: 'string', default: '50' },
    seconds: { type: 'string', default: '16' },
    rounds: { type: 'string', default: '2' },
    'no-reference': { type: 'boolean', default: false },
    // The identity pair: vmseed over the agent's directory with the
    // launcher pods known and without, in the same rounds.
    'no-identity': { type: 'boolean', default: false },
    // Only the identity pair.
    'identity-only': { type: 'boolean', default: false },
    // The identity pair's rounds, and how long its rows load the seeds (a
    // row with events lasts as long as the boots take, ~15 s, whatever
    // this says). A server's boots must end over 30 s apart, the
    // tracker's EVENT_MIN_INTERVAL_MS, or their Events are not recorded
    // and the rows with events do less than a boot's work.
    'identity-rounds': { type: 'string', default: '8' },
    'identity-seconds': { type: 'string', default: '18' },
  },
});
const VMS = Number(values.vms);
const SECONDS = Number(values.seconds);
const ROUNDS = Number(values.rounds);
const IDENTITY_ROUNDS = Number(values['identity-rounds']);
const IDENTITY_SECONDS = Number(values['identity-seconds']);
const FILES = ['network-config', 'meta-data', 'user-data', 'vendor-data'];
const BOOT = JSON.parse(
  readFileSync(new URL('../test/fixtures/cloud-init-events/boot-success.json', import.meta.url), 'utf8'),
) as Array<{ name: string; timestamp: number }>;
const wall = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const sender = !isMainThread ? (workerData as { key: Uint8Array }) : undefined;
const key = sender ? sender.key : new Uint8Array(randomBytes(32));
const ring = new DatasourceKeyring([key]);
const agents = Array.from(
  { length: VMS },
  (_, i) => new Agent({ keepAlive: true, maxSockets: 2, localAddress: `127.0.0.${10 + i}` }),
);
// cloud-init's url_helper.readurl opens a requests.Session per call and
// closes it after, so its webhook handler posts each event on a connection
// of its own (22.4 and 25.1 alike): the events do the same here, written
// straight to a socket as requests writes them (keep-alive asked, the
// connection closed by the client once the answer is in) so that the
// simulated guests' own CPU, which shares this machine's cores with the
// server, is no more than sending takes.
const HEAD_END = Buffer.from('\r\n\r\n');
function post(port: number, i: number, path: string, body: string): Promise<number> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let settled = false;
    const done = (status: number) => {
      if (settled) return;
      settled = true;
      socket.end();
      resolve(status);
    };
    const socket = connect({ host: '127.0.0.1', port, localAddress: `127.0.0.${10 + i}` }, () => {
      socket.write(
        `POST ${path} HTTP/1.1\r\nHost: 169.254.169.254\r\nUser-Agent: Cloud-Init/22.4.2\r\n` +
          `Accept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
    });
    socket.on('data', (c: Buffer) => {
      chunks.push(c);
      const all = Buffer.concat(chunks);
      const end = all.indexOf(HEAD_END);
      if (end < 0) return;
      const head = all.subarray(0, end).toString('latin1');
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
      if (all.length >= end + 4 + length) done(Number(head.slice(9, 12)));
    });
    socket.on('error', () => done(0));
    socket.on('close', () => done(0));
    // An answer that never comes counts as lost rather than hanging the row.
    socket.setTimeout(10_000, () => {
      done(0);
      socket.destroy();
    });
  });
}

function get(port: number, i: number, path: string): Promise<number> {
  return new Promise((resolve) => {
    const req = request({ host: '127.0.0.1', port, method: 'GET', path, agent: agents[i] }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', () => resolve(0));
    req.end();
  });
}

// Every VM's four files once a second, each timed from when it was due.
async function seedLoad(port: number, until: number, latencies: number[]): Promise<void> {
  const one = async (i: number) => {
    const base = `/v1/${signToken(key, `uid-${i}`)}/`;
    let due = performance.now() + Math.random() * 1000;
    while (due < until) {
      await sleep(Math.max(0, due - performance.now()));
      for (const f of FILES) {
        const status = await get(port, i, base + f);
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

async function boots(port: number): Promise<Boot> {
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
      if ((await post(port, i, path, JSON.stringify(e))) !== 200) out.lost++;
    }
  };
  await Promise.all(Array.from({ length: VMS }, (_, i) => one(i)));
  return out;
}

// The sender thread: ready once it has loaded, then one boot of every VM
// for each port it is sent.
interface BootReport {
  lost: number;
  sent: number;
  finalSentAt: Array<[string, number]>;
}
async function startSender(): Promise<{ boots: (port: number) => Promise<Boot>; stop: () => Promise<void> }> {
  const w = new Worker(new URL(import.meta.url), { workerData: { key }, argv: process.argv.slice(2) });
  const next = <T>() =>
    new Promise<T>((resolve, reject) => {
      const fail = (e: Error) => reject(e);
      w.once('error', fail);
      w.once('message', (m: T) => {
        w.off('error', fail);
        resolve(m);
      });
    });
  await next<'ready'>();
  return {
    boots: async (port) => {
      const r = next<BootReport>();
      w.postMessage(port);
      const b = await r;
      return { ...b, finalSentAt: new Map(b.finalSentAt) };
    },
    stop: async () => {
      await w.terminate();
    },
  };
}

interface Collected {
  eventAt: Record<string, number>;
  statusAt: Record<string, number>;
  // Events the server answered 200, since it started.
  accepted: number;
  busyMs: number;
  cpuMs: number;
}

// A server in a worker thread of its own; collect() reads what it saw
// since the last collect().
interface Server {
  name: string;
  port: number;
  collect: () => Promise<Collected>;
  stop: () => Promise<number>;
}
async function startServer(name: string, file: string, launchers?: boolean): Promise<Server> {
  const w = new Worker(new URL(file, import.meta.url), {
    workerData: { key, vmis: VMS, ...(launchers !== undefined ? { launchers } : {}) },
  });
  const port = await new Promise<number>((resolve, reject) => {
    w.once('message', (m: { port: number }) => resolve(m.port));
    w.once('error', reject);
  });
  return {
    name,
    port,
    collect: () => {
      w.postMessage('collect');
      return new Promise((resolve) => w.once('message', resolve));
    },
    stop: () => w.terminate(),
  };
}

// What one server's rows came to.
class Tally {
  readonly without: number[] = [];
  readonly with: number[] = [];
  readonly toEvent: number[] = [];
  readonly toStatus: number[] = [];
  lost = 0;
  sent = 0;
  // The server's own count of events it answered 200, at the last collect.
  acceptedSoFar = 0;
  cpuWith = 0;
  cpuWithout = 0;
  // Server thread CPU per request (seed fetches and events), µs, per row.
  readonly perRequestWithout: number[] = [];
  readonly perRequestWith: number[] = [];
}

// One row: the seed load on `server` for `seconds`, and with `events` one
// boot of every VM beside it; what it came to goes to `t`, and its line
// to the table.
async function runRow(
  server: Server,
  t: Tally,
  round: number,
  events: boolean,
  seconds: number,
  senderThread: { boots: (port: number) => Promise<Boot> },
): Promise<string> {
  const latencies: number[] = [];
  const until = performance.now() + seconds * 1000;
  const [, boot] = await Promise.all([
    seedLoad(server.port, until, latencies),
    events ? senderThread.boots(server.port) : Promise.resolve(undefined),
  ]);
  const c = await server.collect();
  const accepted = c.accepted - t.acceptedSoFar;
  t.acceptedSoFar = c.accepted;
  (events ? t.with : t.without).push(...latencies);
  if (events) t.cpuWith += c.cpuMs;
  else t.cpuWithout += c.cpuMs;
  const served = latencies.length + (boot ? boot.sent - boot.lost : 0);
  (events ? t.perRequestWith : t.perRequestWithout).push((c.cpuMs * 1000) / Math.max(1, served));
  let extra = '';
  if (boot) {
    t.lost += boot.lost;
    t.sent += boot.sent;
    for (const [vm, sent] of boot.finalSentAt) {
      if (c.eventAt[vm] !== undefined) t.toEvent.push(c.eventAt[vm] - sent);
      if (c.statusAt[vm] !== undefined) t.toStatus.push(c.statusAt[vm] - sent);
    }
    extra = `events sent ${boot.sent}, accepted by the server ${accepted}, lost ${boot.lost}`;
    if (!server.name.startsWith('bare')) extra += `, Events ${Object.keys(c.eventAt).length}/${VMS}`;
  }
  return `| ${round + 1} | ${server.name} | ${events ? 'with events' : 'seeds only'} | ${latencies.length} | ${quantile(latencies, 0.5).toFixed(2)} | ${quantile(latencies, 0.99).toFixed(2)} | ${c.busyMs.toFixed(0)} | ${c.cpuMs.toFixed(0)} | ${extra} |`;
}

async function main(): Promise<void> {
  const only = values['identity-only'];
  const servers: Server[] = [];
  if (!only) servers.push(await startServer('vmseed', './provisioning-worker.ts'));
  if (!values['no-reference'] && !only)
    servers.push(await startServer('bare node:http', './provisioning-bare-worker.ts'));
  // The identity checks' cost: launcher pods known (each VM's requests from
  // its launcher IP, the case that is served) and not (today's).
  const identity: Server[] = [];
  if (!values['no-identity'] || only) {
    identity.push(await startServer('vmseed, no launcher knowledge', './provisioning-worker.ts', false));
    identity.push(await startServer('vmseed, identity checks', './provisioning-worker.ts', true));
  }
  const rotated = [...servers];
  servers.push(...identity);
  const tallies = new Map(servers.map((s) => [s, new Tally()]));
  const senderThread = await startSender();
  for (const server of servers) {
    await seedLoad(server.port, performance.now() + 3000, []);
    tallies.get(server)!.acceptedSoFar = (await server.collect()).accepted;
  }
  const rows: string[] = [];
  for (let round = 0; round < ROUNDS && rotated.length > 0; round++) {
    for (let k = 0; k < rotated.length; k++) {
      const server = rotated[(k + round) % rotated.length];
      for (const events of [false, true]) {
        rows.push(await runRow(server, tallies.get(server)!, round, events, SECONDS, senderThread));
        console.log(rows.at(-1));
      }
    }
  }
  // The identity pair: each load's two rows at once (the second server's
  // events from a sender thread of their own), the one started first
  // alternating, so that what else the machine does meanwhile weighs on
  // both alike.
  const identityRows: string[] = [];
  const pairSenders = identity.length === 2 ? [senderThread, await startSender()] : [];
  for (let round = 0; round < IDENTITY_ROUNDS && identity.length === 2; round++) {
    for (const [slot, events] of [false, true].entries()) {
      const order = pairOrder(round, slot);
      // CPU the idle threads spent since their last rows is no part of these.
      for (const server of identity) tallies.get(server)!.acceptedSoFar = (await server.collect()).accepted;
      const lines: Array<Promise<string>> = [];
      for (const s of order)
        lines[s] = runRow(identity[s], tallies.get(identity[s])!, round, events, IDENTITY_SECONDS, pairSenders[s]);
      const done = await Promise.all(lines);
      for (const s of order) {
        identityRows.push(done[s]);
        console.log(done[s]);
      }
    }
  }
  if (rotated.length > 0) {
    console.log(`\n${VMS} VMs, ${SECONDS} s rows, ${ROUNDS} rounds; seed fetches: ${VMS * 4}/s`);
    console.log(
      '| round | server | load | seed requests | p50 ms | p99 ms | server busy ms | server CPU ms | events |',
    );
    console.log('|---|---|---|---|---|---|---|---|---|');
    console.log(rows.join('\n'));
  }
  if (identityRows.length > 0) {
    console.log(
      `\nThe identity pair: ${VMS} VMs, ${IDENTITY_SECONDS} s of seed load a row (rows with events: as long as the boots), ${IDENTITY_ROUNDS} rounds, the two servers' rows of a round at once; seed fetches: ${VMS * 4}/s to each`,
    );
    console.log(
      '| round | server | load | seed requests | p50 ms | p99 ms | server busy ms | server CPU ms | events |',
    );
    console.log('|---|---|---|---|---|---|---|---|---|');
    console.log(identityRows.join('\n'));
  }
  const ratios: number[] = [];
  for (const server of servers) {
    const t = tallies.get(server)!;
    const p99Without = quantile(t.without, 0.99);
    const p99With = quantile(t.with, 0.99);
    ratios.push(p99With / p99Without);
    console.log(`\n${server.name}:`);
    console.log(
      `  seed fetch p99: ${p99Without.toFixed(2)} ms without events, ${p99With.toFixed(2)} ms with (${(p99With / p99Without).toFixed(2)}x)`,
    );
    console.log(`  events: ${t.sent} sent, ${t.lost} lost`);
    // The server thread's own CPU (user + system), whatever else ran.
    const perSeedUs = (t.cpuWithout / Math.max(1, t.without.length)) * 1000;
    const perEventUs = ((t.cpuWith - t.cpuWithout) / Math.max(1, t.sent)) * 1000;
    console.log(
      `  server thread CPU: ${perSeedUs.toFixed(0)} µs per seed request, ${perEventUs.toFixed(0)} µs more per event`,
    );
    if (t.toEvent.length > 0) {
      console.log(
        `  final event sent -> Event recorded: median ${quantile(t.toEvent, 0.5).toFixed(2)} ms, p99 ${quantile(t.toEvent, 0.99).toFixed(2)} ms (${t.toEvent.length} boots)`,
      );
      console.log(
        `  final event sent -> status "succeeded": median ${quantile(t.toStatus, 0.5).toFixed(2)} ms, p99 ${quantile(t.toStatus, 0.99).toFixed(2)} ms`,
      );
    }
  }
  if (!only && !values['no-reference'])
    console.log(`\nvmseed's ratio over the reference's: ${(ratios[0] / ratios[1]).toFixed(2)}x`);
  if (identity.length === 2) {
    const [none, checked] = identity.map((s) => tallies.get(s)!);
    console.log(
      `\nIdentity checks: server thread CPU per request (seed fetches and events answered), µs, over ${IDENTITY_ROUNDS} rows each`,
    );
    console.log('| load | server | median | p99 | total CPU / requests |');
    console.log('|---|---|---|---|---|');
    const total = (t: Tally, events: boolean) =>
      ((events ? t.cpuWith : t.cpuWithout) * 1000) /
      Math.max(1, events ? t.with.length + t.sent - t.lost : t.without.length);
    for (const events of [false, true])
      for (const [s, t] of [
        [identity[0], none],
        [identity[1], checked],
      ] as const) {
        const xs = events ? t.perRequestWith : t.perRequestWithout;
        console.log(
          `| ${events ? 'with events' : 'seeds only'} | ${s.name} | ${quantile(xs, 0.5).toFixed(1)} | ${quantile(xs, 0.99).toFixed(1)} | ${total(t, events).toFixed(1)} |`,
        );
      }
    for (const events of [false, true]) {
      const a = events ? none.perRequestWith : none.perRequestWithout;
      const b = events ? checked.perRequestWith : checked.perRequestWithout;
      console.log(
        `${events ? 'with events' : 'seeds only'}: identity checks / none: median ${(quantile(b, 0.5) / quantile(a, 0.5)).toFixed(3)}x, p99 ${(quantile(b, 0.99) / quantile(a, 0.99)).toFixed(3)}x, total ${(total(checked, events) / total(none, events)).toFixed(3)}x`,
      );
    }
    console.log('');
    for (const l of identityVerdict([
      { load: 'seeds only', none: none.perRequestWithout, checked: checked.perRequestWithout },
      { load: 'with events', none: none.perRequestWith, checked: checked.perRequestWith },
    ]))
      console.log(l);
    // Every row is over: the lookup does not compete with the servers.
    const lookup = identityLookupCost(key, VMS, (i) => `127.0.0.${10 + i}`);
    for (const l of lookupLines('seeds only', lookup, quantile(none.perRequestWithout, 0.5))) console.log(l);
    for (const l of lookupLines('with events', lookup, quantile(none.perRequestWith, 0.5))) console.log(l);
  }
  for (const a of agents) a.destroy();
  await senderThread.stop();
  if (pairSenders.length > 1) await pairSenders[1].stop();
  for (const server of servers) await server.stop();
}

if (sender) {
  parentPort!.on('message', (port: number) => {
    void boots(port).then((b) => {
      const report: BootReport = { lost: b.lost, sent: b.sent, finalSentAt: [...b.finalSentAt] };
      parentPort!.postMessage(report);
    });
  });
  parentPort!.postMessage('ready');
} else await main();
