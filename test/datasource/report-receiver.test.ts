// The datasource listener's progress receiver against a real listener:
// cloud-init's own events (test/fixtures/cloud-init-events, made by
// cloud-init's reporting code) accepted for the VMI the token names, and
// every hostile form refused with its own status, counted and bounded.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { connect, type Socket } from 'node:net';
import { readFileSync } from 'node:fs';
import pino from 'pino';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';
import type { SeedDirectoryEntry } from '../../src/datasource/types.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { reportToken } from '../../src/datasource/reports/report-token.ts';
import { REPORT_LIMITS, type ProgressSink, type ReportLimits } from '../../src/datasource/reports/receiver.ts';
import type { ReportedEvent } from '../../src/datasource/reports/event.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { MapDirectory, nocloudSeed, randomKey } from './datasource-fixtures.ts';

const FIXTURES = new URL('../fixtures/cloud-init-events/', import.meta.url);
const BOOT = JSON.parse(readFileSync(new URL('boot-success.json', FIXTURES), 'utf8')) as object[];

class Sink implements ProgressSink {
  readonly got: Array<{ uid: string; event: ReportedEvent }> = [];
  gone = new Set<string>();
  report(entry: SeedDirectoryEntry, event: ReportedEvent): boolean {
    if (this.gone.has(entry.uid)) return false;
    this.got.push({ uid: entry.uid, event });
    return true;
  }
}

interface Rig {
  server: DatasourceServer;
  dir: MapDirectory;
  ring: DatasourceKeyring;
  sink: Sink;
  metrics: ReturnType<typeof createMetrics>;
  logs: Array<Record<string, unknown>>;
  url(uid: string): string;
  advance(ms: number): void;
}

async function rig(t: { after(fn: () => Promise<void>): void }, limits?: ReportLimits): Promise<Rig> {
  const dir = new MapDirectory();
  for (const n of ['a', 'b']) dir.add({ namespace: 'ns', name: `vm-${n}`, uid: `uid-${n}`, seed: nocloudSeed(n) });
  const ring = new DatasourceKeyring([randomKey()]);
  const sink = new Sink();
  const metrics = createMetrics({ version: 't', processMetrics: false });
  const logs: Array<Record<string, unknown>> = [];
  const logger = pino({ level: 'warn' }, { write: (line: string) => logs.push(JSON.parse(line)) });
  let mono = 0;
  const server = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: dir,
    keyring: ring,
    logger,
    metrics,
    clock: { now: () => new Date(), monotonicMs: () => mono },
    reports: { sink, ...(limits ? { limits } : {}) },
  });
  t.after(() => server.close());
  return {
    server,
    dir,
    ring,
    sink,
    metrics,
    logs,
    url: (uid) => `${server.baseUrl}/${reportToken(ring, uid)}/cloud-init-events`,
    advance: (ms) => {
      mono += ms;
    },
  };
}

interface Reply {
  status: number;
  body: string;
}

function post(
  url: string,
  body: string | Buffer,
  o: { method?: string; headers?: Record<string, string>; chunked?: boolean; localAddress?: string } = {},
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { ...o.headers };
    if (!o.chunked) headers['Content-Length'] = String(Buffer.byteLength(body));
    const at = o.localAddress ? { localAddress: o.localAddress } : {};
    const req = request(url, { method: o.method ?? 'POST', headers, agent: false, ...at }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    // The server may answer and close before a refused body is all sent.
    req.on('error', (e: NodeJS.ErrnoException) =>
      e.code === 'EPIPE' || e.code === 'ECONNRESET' ? undefined : reject(e),
    );
    if (o.method === 'GET') req.end();
    else req.end(body);
  });
}

async function refused(m: Rig, reason: string): Promise<number> {
  const metric = await m.metrics.provisioningReportsRefused.get();
  return metric.values.find((v) => v.labels.reason === reason)?.value ?? 0;
}

test(
  "cloud-init's own boot events are accepted, in order, for the VMI the token names",
  { timeout: 60_000 },
  async (t) => {
    const m = await rig(t);
    for (const e of BOOT) assert.equal((await post(m.url('uid-a'), JSON.stringify(e))).status, 200);
    assert.equal(m.sink.got.length, BOOT.length);
    assert.ok(m.sink.got.every((g) => g.uid === 'uid-a'));
    assert.deepEqual(
      m.sink.got.map((g) => g.event.name),
      BOOT.map((e) => (e as { name: string }).name),
    );
    const last = m.sink.got.at(-1)!.event;
    assert.deepEqual([last.name, last.type, last.result], ['modules-final', 'finish', 'SUCCESS']);
  },
);

test(
  'a token that is not this VMI report token is refused: another VMI, the seed token, another key, gibberish',
  { timeout: 60_000 },
  async (t) => {
    const m = await rig(t);
    const ev = JSON.stringify(BOOT[0]);
    const other = new DatasourceKeyring([randomKey()]);
    const tokens = [
      m.ring.sign('uid-a'), // the seed token: opens the seed, not the reports
      reportToken(other, 'uid-a'),
      reportToken(m.ring, 'uid-unknown'),
      'A'.repeat(43),
    ];
    for (const tok of tokens) {
      const r = await post(`${m.server.baseUrl}/${tok}/cloud-init-events`, ev);
      assert.equal(r.status, 404, tok);
      assert.equal(r.body, 'not found\n');
    }
    assert.equal(m.sink.got.length, 0);
    assert.equal(await refused(m, 'token'), tokens.length);
    // A's token reports for A only, never for B.
    await post(m.url('uid-a'), ev);
    assert.deepEqual(
      m.sink.got.map((g) => g.uid),
      ['uid-a'],
    );
  },
);

test(
  'invalid JSON and bodies that are no cloud-init event are refused, and nothing sent is echoed',
  { timeout: 60_000 },
  async (t) => {
    const m = await rig(t);
    const bad = [
      ['{"name": "<script>alert(1)</script>"', 'invalid-json'],
      ['[1,2,3]', 'invalid-event'],
      [JSON.stringify({ name: '<b>x</b>', event_type: 'start', timestamp: 1, description: '' }), 'invalid-event'],
      [
        JSON.stringify({ name: 'modules-final', event_type: 'finish', timestamp: 1, description: 'x' }),
        'invalid-event',
      ],
      [
        JSON.stringify({ name: 'modules-final', event_type: 'finish', timestamp: 1, result: 'OK<img>' }),
        'invalid-event',
      ],
      [JSON.stringify({ name: 'x'.repeat(200), event_type: 'start', timestamp: 1 }), 'invalid-event'],
    ] as const;
    for (const [body, reason] of bad) {
      const r = await post(m.url('uid-a'), body);
      assert.equal(r.status, 400, body);
      assert.ok(!r.body.includes('<'), r.body);
      assert.ok(!r.body.includes('script') && !r.body.includes('img'), r.body);
      assert.ok((await refused(m, reason)) > 0, reason);
    }
    assert.equal(m.sink.got.length, 0);
  },
);

test('a huge description is cut and stripped of control characters and credentials', { timeout: 60_000 }, async (t) => {
  const m = await rig(t);
  const description = `line one\nFAKE LOG LINE password=hunter2 ${'x'.repeat(5000)}`;
  const r = await post(
    m.url('uid-a'),
    JSON.stringify({
      name: 'modules-final/config-runcmd',
      event_type: 'finish',
      timestamp: 1,
      result: 'FAIL',
      description,
    }),
  );
  assert.equal(r.status, 200);
  const got = m.sink.got[0].event.description;
  assert.ok(got.length <= 200, String(got.length));
  assert.ok(!got.includes('\n') && !got.includes('hunter2'), got);
});

test(
  'bodies over the bound are refused before they are read (Content-Length) or as they pass it (chunked)',
  { timeout: 60_000 },
  async (t) => {
    const m = await rig(t);
    const big = Buffer.alloc(1024 * 1024, 'a');
    assert.equal((await post(m.url('uid-a'), big)).status, 413);
    assert.equal((await post(m.url('uid-a'), big, { chunked: true })).status, 413);
    assert.equal(await refused(m, 'too-large'), 2);
    // Forms and other types are refused by their Content-Type, unread.
    const form = await post(m.url('uid-a'), 'a=b', {
      headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    });
    assert.equal(form.status, 415);
    const get = await post(m.url('uid-a'), '', { method: 'GET' });
    assert.equal(get.status, 405);
    assert.equal(m.sink.got.length, 0);
    // The listener still answers.
    assert.equal((await post(m.url('uid-a'), JSON.stringify(BOOT[0]))).status, 200);
  },
);

test('events after the VMI is gone are refused', { timeout: 60_000 }, async (t) => {
  const m = await rig(t);
  const url = m.url('uid-a');
  assert.equal((await post(url, JSON.stringify(BOOT[0]))).status, 200);
  m.dir.remove('uid-a');
  assert.equal((await post(url, JSON.stringify(BOOT[1]))).status, 404);
  // Gone from the agent's records while still in the directory.
  m.sink.gone.add('uid-b');
  assert.equal((await post(m.url('uid-b'), JSON.stringify(BOOT[1]))).status, 404);
  assert.equal(m.sink.got.length, 1);
  assert.equal(await refused(m, 'token'), 1);
  assert.equal(await refused(m, 'gone'), 1);
});

test(
  'one VMI flooding empties its own bucket, not the other VMI; refusals are logged once',
  { timeout: 60_000 },
  async (t) => {
    const m = await rig(t, { perVmBurst: 20, perVmRatePerSecond: 1, globalBurst: 30, globalRatePerSecond: 1 });
    const ev = JSON.stringify(BOOT[0]);
    const statuses: number[] = [];
    for (let i = 0; i < 100; i++) statuses.push((await post(m.url('uid-a'), ev)).status);
    assert.equal(statuses.filter((s) => s === 200).length, 20);
    assert.equal(statuses.filter((s) => s === 429).length, 80);
    // B still gets through: A's refused requests took nothing from the node's bucket.
    for (let i = 0; i < 10; i++) assert.equal((await post(m.url('uid-b'), ev)).status, 200);
    assert.equal(await refused(m, 'vm-rate'), 80);
    const logged = m.logs.filter((l) => l.reason === 'vm-rate');
    assert.equal(logged.length, 1, 'a flood is logged once a minute, not per request');
    assert.ok(!JSON.stringify(m.logs).includes(reportToken(m.ring, 'uid-a')), 'no token in the log');
    // The bucket refills with time.
    m.advance(5_000);
    assert.equal((await post(m.url('uid-a'), ev)).status, 200);
  },
);

test('the node-wide bucket bounds all VMIs together', { timeout: 60_000 }, async (t) => {
  const m = await rig(t, { globalBurst: 5, globalRatePerSecond: 1 });
  const ev = JSON.stringify(BOOT[0]);
  const statuses: number[] = [];
  for (const uid of ['uid-a', 'uid-b', 'uid-a', 'uid-b', 'uid-a', 'uid-b', 'uid-a'])
    statuses.push((await post(m.url(uid), ev)).status);
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429, 429]);
  assert.equal(await refused(m, 'global-rate'), 2);
});

test('seed requests are answered as before next to the receiver', { timeout: 60_000 }, async (t) => {
  const m = await rig(t);
  const seedUrl = `${m.server.baseUrl}/${m.ring.sign('uid-a')}/meta-data`;
  const r = await post(seedUrl, '', { method: 'GET' });
  assert.equal(r.status, 200);
  assert.match(r.body, /"instance-id":"iid-a"/);
  // A POST to a seed path is the seed server's refusal, not the receiver's.
  assert.equal((await post(seedUrl, '{}')).status, 405);
});

// A guest holding report bodies open: `count` connections from `from`, each
// announcing a 300-byte event and sending it a byte every 100 ms, never
// finishing. Resolves each connection's end: when it closed and what it got.
function drip(
  server: DatasourceServer,
  path: string,
  from: string,
  count: number,
): Array<Promise<{ closedAfterMs: number; answer: string }>> {
  const started = performance.now();
  return Array.from({ length: count }, () => {
    const socket: Socket = connect({ host: '127.0.0.1', port: server.address.port, localAddress: from });
    socket.on('error', () => undefined);
    socket.write(`POST ${path} HTTP/1.1\r\nHost: 169.254.169.254\r\nContent-Length: 300\r\n\r\n`);
    const timer = setInterval(() => socket.writable && socket.write('{'), 100);
    let answer = '';
    socket.on('data', (c: Buffer) => (answer += c.toString()));
    return new Promise((resolve) =>
      socket.once('close', () => {
        clearInterval(timer);
        resolve({ closedAfterMs: performance.now() - started, answer: answer.split('\r\n')[0] });
      }),
    );
  });
}

test(
  "two guests dripping report bodies never finishing deny no other guest's reports, and are cut at the deadline",
  { timeout: 60_000 },
  async (t) => {
    const m = await rig(t);
    m.dir.add({ namespace: 'ns', name: 'vm-c', uid: 'uid-c', seed: nocloudSeed('c') });
    const pathOf = (uid: string) => new URL(m.url(uid)).pathname;
    // Each dripper as many connections as the listener lets one source open.
    const drips = [
      ...drip(m.server, pathOf('uid-a'), '127.0.0.2', 32),
      ...drip(m.server, pathOf('uid-b'), '127.0.0.3', 32),
    ];
    await new Promise((r) => setTimeout(r, 300));
    const statuses: number[] = [];
    for (const e of BOOT.slice(0, 20))
      statuses.push((await post(m.url('uid-c'), JSON.stringify(e), { localAddress: '127.0.0.4' })).status);
    assert.deepEqual(
      statuses,
      statuses.map(() => 200),
      'the third guest reports while the other two drip',
    );
    const ends = await Promise.all(drips);
    const cut = ends.filter((e) => e.answer === 'HTTP/1.1 408 Request Timeout');
    // The bodies that got a slot were cut at the deadline (+ a margin for
    // a loaded machine), not left to the listener's whole-request timeout.
    assert.equal(cut.length, 2 * REPORT_LIMITS.perVmInFlight);
    const last = Math.max(...cut.map((e) => e.closedAfterMs));
    assert.ok(last < REPORT_LIMITS.bodyDeadlineMs + 1_500, `the last dripper was cut after ${last.toFixed(0)} ms`);
    // The rest were refused on arrival.
    assert.ok(
      ends.every((e) => e.answer !== ''),
      'every dripping connection was answered',
    );
    assert.equal(await refused(m, 'slow'), 2 * REPORT_LIMITS.perVmInFlight);
    assert.equal(m.sink.got.filter((g) => g.uid !== 'uid-c').length, 0);
    assert.ok(!JSON.stringify(m.logs).includes(reportToken(m.ring, 'uid-a')), 'no token in the log');
  },
);
