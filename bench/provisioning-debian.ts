// The Debian guest (cloud-init 22.4) under TCG, booted --boots times one
// after the other on seeds the agent renders, with its progress reports
// going to the agent's datasource listener: how long from cloud-init's
// final stage ending in the guest to the ProvisioningSucceeded Event at the
// API server and to the status page saying so, and where a boot's time goes
// (the timeline's stages).
//
// The node side is the agent in this process (test/support/agent-harness.ts:
// the fake API server, the real renderer, image store, datasource listener,
// ProvisioningTracker, Event recorder and VMI annotation writer, all at
// their defaults). The guest is e2e/support/guest/debian.ts's cached image,
// booted by QEMU with the agent's ISO as its NoCloud disk; QEMU's user
// network relays 10.0.2.100:80 to the listener (a busybox nc per
// connection, as in the Debian e2e tests), where the seed's reporting part
// points cloud-init's webhook handler.
//
// Where each time comes from:
//  - the final event's guest time: the `timestamp` of modules-final's
//    finish (cloud-init's time.time() in the guest), as the agent parsed
//    it (the bench wraps the tracker's report() to keep each event with the
//    time the agent received it);
//  - the Event: the fake API server's answer to its create (its own clock,
//    the host's);
//  - the status page: the first GET /status.json (every --poll-ms) that
//    shows the boot done: late by at most one poll interval;
//  - the annotation: the fake API server's answer to the patch that
//    carries the done summary (at most one write per VMI per 10 s).
// The guest clock starts from QEMU's RTC (host time, whole seconds: up to
// 1 s behind) and runs on TCG's emulated clock, so the guest's timestamps
// are not the host's. The seed's runcmd measures the difference right
// before the final stage ends: five HTTP round trips from the guest to a
// clock server in this process (10.0.2.2, QEMU's address for the host's
// loopback), each bracketing the host's time between two guest times;
// the shortest one gives offset = host - (t0 + t1) / 2, within +/- half its
// round trip (Cristian's method). The guest's times are moved onto the
// host's by that offset, and the error is printed beside the figures. The
// agent's receive time of the final event bounds it from the other side:
// the event cannot have happened after it arrived.
//
//   npm run bench:provisioning-debian -- [--boots 5] [--poll-ms 50]
//
// Each boot takes 1-7 minutes under TCG depending on the machine's load.
import { parseArgs } from 'node:util';
import { writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { loadavg } from 'node:os';
import pino from 'pino';
import { quantile } from './stats.ts';
import { FakeKube } from '../test/support/fake-kube.ts';
import { startAgent, tempDir, vmi, waitFor } from '../test/support/agent-harness.ts';
import { loopbackDatasource, startedDatasource } from '../test/support/agent-datasource.ts';
import { keyLine, randomKey } from '../test/datasource/datasource-fixtures.ts';
import { cloneRootfs, cloudInitFinished, ensureDebianGuest } from '../e2e/support/guest/debian.ts';
import { runQemu } from '../e2e/support/guest/qemu.ts';
import { prepareNocloudHttp } from '../src/commands/agent/datasource.ts';
import { progressReportPlanner } from '../src/agent/provisioning/report-plan.ts';
import { PROVISIONING_ANNOTATION } from '../src/agent/provisioning/summary.ts';
import type { ReportedEvent } from '../src/datasource/reports/event.ts';
import { startHttpServer } from '../src/http/status-server.ts';
import type { VmiStatusRecord } from '../src/status/snapshot.ts';

const { values } = parseArgs({
  options: {
    boots: { type: 'string', default: '5' },
    'poll-ms': { type: 'string', default: '50' },
  },
});
const BOOTS = Number(values.boots);
const POLL_MS = Number(values['poll-ms']);
const GUEST_IP = '10.0.2.100';
const NAME = 'deb';
// QEMU's user network, statically (as the Debian e2e tests do).
const STATIC_NET =
  'version: 2\nethernets:\n  eth0:\n    addresses: [10.0.2.15/24]\n    routes: [{to: 0.0.0.0/0, via: 10.0.2.2}]\n';
const STAGES = ['init-network', 'modules-config', 'modules-final'] as const;
const hostSeconds = () => (performance.timeOrigin + performance.now()) / 1000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function userData(clockPort: number, probe: string): string {
  const script = [
    'import time, http.client',
    `c = http.client.HTTPConnection('10.0.2.2', ${clockPort}, timeout=30)`,
    'c.connect()',
    'rows = []',
    'for _ in range(5):',
    '    t0 = time.time()',
    `    c.request('GET', '/clock/${probe}')`,
    '    h = c.getresponse().read().decode()',
    '    t1 = time.time()',
    "    rows.append('%r %s %r' % (t0, h, t1))",
    `c.request('POST', '/clock/${probe}', body='\\n'.join(rows))`,
    'c.getresponse().read()',
  ];
  return [
    '#cloud-config',
    'write_files:',
    '  - path: /usr/local/bin/vmseed-clock-probe',
    "    permissions: '0755'",
    '    content: |',
    ...script.map((l) => `      ${l}`),
    'runcmd:',
    '  - [python3, /usr/local/bin/vmseed-clock-probe]',
    '',
  ].join('\n');
}

interface ClockSample {
  t0: number;
  host: number;
  t1: number;
}

// Host minus guest, from the sample with the shortest round trip.
function clockOffset(samples: ClockSample[]): { offset: number; error: number } | undefined {
  const best = [...samples].sort((a, b) => a.t1 - a.t0 - (b.t1 - b.t0))[0];
  if (!best) return undefined;
  return { offset: best.host - (best.t0 + best.t1) / 2, error: (best.t1 - best.t0) / 2 };
}

async function body(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

// The clock server the guest's probe asks.
async function startClockServer() {
  const samples = new Map<string, ClockSample[]>();
  const server = createServer((req, res) => {
    const now = hostSeconds();
    const probe = /^\/clock\/([a-z0-9-]+)$/.exec(req.url ?? '')?.[1];
    if (!probe) return void res.writeHead(404).end();
    if (req.method === 'GET') return void res.writeHead(200).end(now.toFixed(6));
    void body(req).then((text) => {
      samples.set(
        probe,
        text
          .split('\n')
          .map((l) => l.split(' ').map(Number))
          .filter((n) => n.length === 3 && n.every(Number.isFinite))
          .map(([t0, host, t1]) => ({ t0, host, t1 })),
      );
      res.writeHead(200).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as AddressInfo).port, samples };
}

interface Arrival {
  event: ReportedEvent;
  at: number; // ms, host
}

interface BootResult {
  loadavg: number;
  bootSeconds: number;
  clock: { offset: number; error: number };
  // ms: guest's final finish (on the host's clock) to each.
  finalToArrival: number;
  finalToEvent: number;
  finalToStatus: number;
  // The GET /status.json that showed it: request to parsed answer.
  statusFetchMs: number;
  // Median time between two events' arrivals in modules-final: how fast the
  // guest's cloud-init posts them one after the other.
  postPaceMs: number;
  finalToAnnotation: number | undefined;
  // ms: the agent's receipt of the final event to each (host clock only).
  arrivalToEvent: number;
  arrivalToStatus: number;
  // The timeline, seconds.
  rows: Record<string, number>;
}

const fake = await FakeKube.start();
const dir = await tempDir('vmseed-bench-debian-');
const clock = await startClockServer();
const guest = await ensureDebianGuest();
const keyFile = join(dir.path, 'keys');
await writeFile(keyFile, `${keyLine(randomKey())}\n`);
const ds = await prepareNocloudHttp(loopbackDatasource(keyFile), pino({ level: 'silent' }));
const listener = startedDatasource(ds);
const arrivals = new Map<string, Arrival[]>();
const h = await startAgent(fake, {
  stateDir: join(dir.path, 'seeds'),
  nocloudHttp: ds.agentOptions,
  reportPlan: progressReportPlanner({
    enabled: true,
    datasource: { keyring: ds.keyring, baseUrl: `http://${GUEST_IP}/v1` },
  }),
  annotateVmis: {},
  beforeStart: async (agent) => {
    const tracker = agent.provisioning;
    const report = tracker.report.bind(tracker);
    tracker.report = (entry, event, at) => {
      const list = arrivals.get(entry.uid) ?? [];
      list.push({ event, at: at.getTime() });
      arrivals.set(entry.uid, list);
      return report(entry, event, at);
    };
    await listener.beforeStart(agent);
  },
});
const http = await startHttpServer({
  listen: '127.0.0.1:0',
  metrics: h.metrics,
  status: h.agent.status,
  logger: h.logger,
});
const listenerPort = Number(new URL(listener.baseUrl).port);

async function statusOf(namespace: string): Promise<VmiStatusRecord | undefined> {
  const json = (await (await fetch(`${http.url}/status.json`)).json()) as { vmis: VmiStatusRecord[] };
  return json.vmis.find((v) => v.namespace === namespace && v.name === NAME);
}

const guestEvent = (list: Arrival[], name: string, type: 'start' | 'finish') =>
  list.find((a) => a.event.name === name && a.event.type === type);

async function boot(i: number): Promise<BootResult> {
  const ns = `boot-${i}`;
  const cloudInit = JSON.stringify({ userData: userData(clock.port, ns), networkData: STATIC_NET });
  const created = Date.now();
  const uid = fake.applyVmi(vmi(NAME, { namespace: ns, cloudInit })).metadata.uid!;
  const seeded = await waitFor(
    `${ns}'s seed`,
    () => {
      const s = h.agent.status.get(`${ns}/${NAME}`);
      return s?.state === 'ready' && s.imagePath ? s : undefined;
    },
    120_000,
  );
  const root = await cloneRootfs(join(dir.path, ns), guest.rootfs);
  const stop = new AbortController();
  const started = Date.now();
  const load = loadavg()[0];
  const run = runQemu({
    kernel: guest.kernel,
    initrd: guest.initramfs,
    append: guest.cmdline,
    drives: [
      { path: root.path, format: root.format, readonly: false },
      { path: seeded.imagePath!, format: 'raw', readonly: true },
    ],
    // Not restricted: the clock probe reaches this process at 10.0.2.2.
    net: { restrict: false, guestfwd: { guestIp: GUEST_IP, guestPort: 80, hostPort: listenerPort } },
    memoryMb: 512,
    timeoutMs: 900_000,
    consoleFile: join(dir.path, `${ns}-console.log`),
    signal: stop.signal,
  });
  let exited = false;
  void run.then(() => (exited = true));
  try {
    // The status page, polled as a user's browser would.
    let statusAt: number | undefined;
    let statusAsked = 0;
    let done: VmiStatusRecord | undefined;
    while (statusAt === undefined) {
      if (exited) throw new Error(`${ns}: QEMU ended before the boot was done: ${(await run).console.slice(-2000)}`);
      statusAsked = Date.now();
      const s = await statusOf(ns);
      const state = s?.provisioning?.state;
      if (state === 'succeeded' || state === 'failed') [statusAt, done] = [Date.now(), s];
      else await sleep(POLL_MS);
    }
    if (done!.provisioning!.state !== 'succeeded')
      throw new Error(`${ns}: ${JSON.stringify(done!.provisioning!.failure)}`);
    const list = arrivals.get(uid) ?? [];
    if (process.env.VMSEED_BENCH_EVENTS)
      await writeFile(`${process.env.VMSEED_BENCH_EVENTS}-${ns}.json`, JSON.stringify(list, null, 1));
    const final = guestEvent(list, 'modules-final', 'finish')!;
    const eventAt = await waitFor(
      `${ns}'s ProvisioningSucceeded Event`,
      () => {
        if (!fake.events().some((e) => e.metadata.namespace === ns && e.reason === 'ProvisioningSucceeded')) return;
        return fake.requests.find(
          (r) => r.resource === 'events' && r.verb === 'create' && r.namespace === ns && r.at >= final.at,
        )?.at;
      },
      30_000,
    );
    const annotated = await waitFor(
      `${ns}'s annotation`,
      () => fake.getVmi(ns, NAME)?.metadata.annotations?.[PROVISIONING_ANNOTATION]?.includes('"succeeded"'),
      30_000,
    ).catch(() => false);
    const annotationAt = annotated
      ? fake.requests.findLast(
          (r) =>
            r.resource === 'virtualmachineinstances' && r.verb === 'patch' && r.namespace === ns && r.status === 200,
        )?.at
      : undefined;
    const offset = await waitFor(`${ns}'s clock probe`, () => clockOffset(clock.samples.get(ns) ?? []), 10_000);
    stop.abort();
    if (!cloudInitFinished((await run).console))
      process.stderr.write(`# ${ns}: the console does not show cloud-init's end\n`);

    // Guest times onto the host's clock, in ms.
    const onHost = (ts: number) => (ts + offset.offset) * 1000;
    const finalHost = onHost(final.event.timestamp);
    // cloud-init reads its reporting configuration in each stage's process
    // after the stage's start event: each stage counts from its first
    // reported event.
    const firstOf = (stage: string) =>
      list
        .filter((a) => a.event.name.startsWith(`${stage}/`))
        .reduce((a, b) => (b.event.timestamp < a.event.timestamp ? b : a));
    const rows: Record<string, number> = {
      'VMI created → seed written': (Date.parse(seeded.generatedAt!) - created) / 1000,
      'QEMU started → first reported event (firmware, kernel, systemd, init-local, init-network until reporting is set up)':
        (onHost(firstOf(STAGES[0]).event.timestamp) - started) / 1000,
    };
    STAGES.forEach((stage, k) => {
      const s = firstOf(stage).event.timestamp;
      const f = guestEvent(list, stage, 'finish')!.event.timestamp;
      if (k > 0) {
        const prev = guestEvent(list, STAGES[k - 1], 'finish')!.event.timestamp;
        rows[`${STAGES[k - 1]} finish → ${stage}'s first event`] = s - prev;
      }
      rows[stage] = f - s;
    });
    rows['modules-final: config-scripts-user (the runcmd clock probe)'] =
      guestEvent(list, 'modules-final/config-scripts-user', 'finish')!.event.timestamp -
      guestEvent(list, 'modules-final/config-scripts-user', 'start')!.event.timestamp;
    rows['modules-final finish → ProvisioningSucceeded Event'] = (eventAt - finalHost) / 1000;
    rows['QEMU started → ProvisioningSucceeded Event'] = (eventAt - started) / 1000;
    fake.deleteVmi(ns, NAME);
    return {
      loadavg: load,
      bootSeconds: (eventAt - started) / 1000,
      clock: offset,
      finalToArrival: final.at - finalHost,
      finalToEvent: eventAt - finalHost,
      finalToStatus: statusAt - finalHost,
      statusFetchMs: statusAt - statusAsked,
      postPaceMs: quantile(
        list
          .slice(1)
          .map((a, k) => a.at - list[k].at)
          .filter((_, k) => list[k + 1].event.name.startsWith('modules-final/')),
        0.5,
      ),
      finalToAnnotation: annotationAt === undefined ? undefined : annotationAt - finalHost,
      arrivalToEvent: eventAt - final.at,
      arrivalToStatus: statusAt - final.at,
      rows,
    };
  } finally {
    stop.abort();
    await run.catch(() => undefined);
  }
}

const results: BootResult[] = [];
try {
  for (let i = 0; i < BOOTS; i++) {
    const r = await boot(i);
    results.push(r);
    console.log(
      `# boot ${i + 1}/${BOOTS}: ${r.bootSeconds.toFixed(1)} s to the Event, load ${r.loadavg.toFixed(1)}; ` +
        `clock offset ${(r.clock.offset * 1000).toFixed(0)} ms ± ${(r.clock.error * 1000).toFixed(0)}; ` +
        `final → arrival ${r.finalToArrival.toFixed(0)} ms, → Event ${r.finalToEvent.toFixed(0)} ms, → status page ${r.finalToStatus.toFixed(0)} ms (its GET took ${r.statusFetchMs} ms)` +
        (r.finalToAnnotation === undefined ? '' : `, → annotation ${r.finalToAnnotation.toFixed(0)} ms`) +
        `; one POST every ${r.postPaceMs.toFixed(0)} ms (median) in modules-final`,
    );
  }
} finally {
  await http.close();
  await listener.close();
  await h.stop();
  await new Promise<void>((r) => clock.server.close(() => r()));
  await fake.close();
  await dir.remove();
}

const n = results.length;
if (process.env.VMSEED_BENCH_EVENTS)
  await writeFile(`${process.env.VMSEED_BENCH_EVENTS}-results.json`, JSON.stringify(results, null, 1));
const ms = (pick: (r: BootResult) => number) => results.map(pick);
function row(label: string, v: number[], digits = 0): void {
  const f = (x: number) => x.toFixed(digits);
  console.log(`| ${label} | ${f(quantile(v, 0.5))} | ${f(quantile(v, 0.99))} | ${f(Math.max(...v))} |`);
}
const errors = ms((r) => r.clock.error * 1000);
console.log(
  `\n${n} boots; load average (1 min) at each boot's start: ${ms((r) => r.loadavg)
    .map((l) => l.toFixed(1))
    .join(', ')}`,
);
console.log(
  `guest clock onto the host's: error (half the probe's shortest round trip) median ${quantile(errors, 0.5).toFixed(0)} ms, max ${Math.max(...errors).toFixed(0)} ms`,
);
console.log(`p99 is the nearest rank: with ${n} boots, the largest.\n`);
const annotations = results.flatMap((r) => (r.finalToAnnotation === undefined ? [] : [r.finalToAnnotation]));
const tables: Array<[string, Array<[string, number[]]>]> = [
  [
    'from modules-final finishing in the guest to (ms)',
    [
      ['the agent receiving its event', ms((r) => r.finalToArrival)],
      ['the ProvisioningSucceeded Event at the API server', ms((r) => r.finalToEvent)],
      [`the status page showing it (polled every ${POLL_MS} ms)`, ms((r) => r.finalToStatus)],
      [`the VMI annotation (${annotations.length}/${n} seen)`, annotations],
    ],
  ],
  [
    'from the agent receiving the final event to (ms, host clock only)',
    [
      ['the Event at the API server', ms((r) => r.arrivalToEvent)],
      ['the status page showing it', ms((r) => r.arrivalToStatus)],
      ['(the GET /status.json that showed it, request to answer)', ms((r) => r.statusFetchMs)],
      ["the guest's cloud-init: one event posted every (each boot's median in modules-final)", ms((r) => r.postPaceMs)],
    ],
  ],
];
for (const [title, rows] of tables) {
  console.log(`| ${title} | median | p99 | max |\n| --- | --- | --- | --- |`);
  for (const [label, v] of rows) if (v.length) row(label, v);
  console.log('');
}
console.log('| timeline (seconds) | median | p99 | max |');
console.log('| --- | --- | --- | --- |');
for (const label of Object.keys(results[0]?.rows ?? {}))
  row(
    label,
    ms((r) => r.rows[label]),
    1,
  );
