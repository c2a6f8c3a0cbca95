import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RedirectStatusPoller, REASON_MAX, RESPONSE_MAX } from '../../src/redirect/status-poller.ts';
import { startRedirectHealth } from '../../src/redirect/health-server.ts';
import { createRedirectMetrics } from '../../src/redirect/redirect-metrics.ts';
import type { RedirectMissingReason } from '../../src/redirect/keeper.ts';
import { configSummary, loadConfig } from '../../src/config/config.ts';

function clock(start: string) {
  let t = Date.parse(start);
  return { now: () => new Date(t), advance: (s: number) => (t += s * 1000) };
}

async function listen(server: Server): Promise<string> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/readyz`;
}

test("the poller follows the sidecar's real /readyz: in place → missing (its reason) → unreachable, with since", async () => {
  const keeper: { inPlace: boolean; lastError: string | undefined; reason: RedirectMissingReason } = {
    inPlace: true,
    lastError: undefined,
    reason: 'not-checked',
  };
  const health = await startRedirectHealth({
    listen: { host: '127.0.0.1', port: 0 },
    keeper,
    metrics: createRedirectMetrics(),
  });
  const url = `http://127.0.0.1:${health.address.port}/readyz`;
  const c = clock('2026-11-23T10:00:00.000Z');
  const poller = new RedirectStatusPoller({ url, now: c.now, timeoutMs: 5000 });
  assert.equal(poller.status, undefined);
  try {
    assert.deepEqual(await poller.poll(), {
      state: 'in-place',
      since: '2026-11-23T10:00:00.000Z',
      checkedAt: '2026-11-23T10:00:00.000Z',
    });
    c.advance(5);
    assert.equal((await poller.poll()).since, '2026-11-23T10:00:00.000Z', 'an unchanged state keeps its since');

    keeper.inPlace = false;
    keeper.reason = 'apply-failed';
    keeper.lastError = 'nft could not load the redirect table ip vmseed_redirect (exit 1): Operation not permitted';
    c.advance(5);
    const missing = await poller.poll();
    assert.equal(missing.state, 'missing');
    assert.equal(
      missing.reason,
      'apply-failed: nft could not load the redirect table ip vmseed_redirect (exit 1): Operation not permitted',
    );
    assert.equal(missing.since, '2026-11-23T10:00:10.000Z');
    c.advance(5);
    assert.equal((await poller.poll()).since, '2026-11-23T10:00:10.000Z');
  } finally {
    await health.close();
  }
  c.advance(5);
  const gone = await poller.poll();
  assert.equal(gone.state, 'unreachable');
  // A pooled keep-alive connection may see the close first (UND_ERR_SOCKET).
  assert.ok(['ECONNREFUSED', 'UND_ERR_SOCKET'].includes(gone.reason!), gone.reason);
  assert.equal(gone.since, '2026-11-23T10:00:20.000Z');
  c.advance(5);
  const still = await poller.poll();
  assert.deepEqual(
    [still.state, still.reason, still.since],
    ['unreachable', 'ECONNREFUSED', '2026-11-23T10:00:20.000Z'],
  );
  assert.deepEqual(poller.status, still);
});

test('a plain-text 503 is missing with its text; a 404 is unreachable (not the sidecar)', async () => {
  let status = 503;
  const server = createServer((_req, res) => {
    res.writeHead(status, { 'Content-Type': 'text/plain' });
    res.end('redirect not in place: <b>flushed</b>\n');
  });
  const url = await listen(server);
  try {
    const poller = new RedirectStatusPoller({ url, timeoutMs: 5000 });
    assert.deepEqual(
      { ...(await poller.poll()), since: '', checkedAt: '' },
      { state: 'missing', reason: 'redirect not in place: <b>flushed</b>', since: '', checkedAt: '' },
    );
    status = 404;
    const r = await poller.poll();
    assert.equal(r.state, 'unreachable');
    assert.match(r.reason!, /^HTTP 404 from http:\/\/127\.0\.0\.1:\d+\/readyz$/);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

test('an endless body is read to 4 KiB only, and a silent server times out as unreachable', async () => {
  let written = 0;
  const big = createServer((_req, res) => {
    res.writeHead(503, { 'Content-Type': 'text/plain' });
    const chunk = 'x'.repeat(16 * 1024);
    const pump = () => {
      while (written < 64 * 1024 * 1024 && res.write(chunk)) written += chunk.length;
      if (written < 64 * 1024 * 1024 && !res.destroyed) res.once('drain', pump);
    };
    res.on('close', () => res.removeAllListeners('drain'));
    pump();
  });
  const bigUrl = await listen(big);
  const silent = createServer(() => {});
  const silentUrl = await listen(silent);
  try {
    const r = await new RedirectStatusPoller({ url: bigUrl, timeoutMs: 20_000 }).poll();
    assert.equal(r.state, 'missing');
    assert.equal(r.reason!.length, REASON_MAX);
    assert.ok(written < 64 * 1024 * 1024, 'the poller stopped reading long before the server ran out');
    assert.ok(RESPONSE_MAX <= 4096);

    const t = await new RedirectStatusPoller({ url: silentUrl, timeoutMs: 200 }).poll();
    assert.deepEqual([t.state, t.reason], ['unreachable', 'no answer within 200 ms']);
  } finally {
    for (const s of [big, silent]) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  }
});

test('start polls until stop', async () => {
  let hits = 0;
  const server = createServer((_req, res) => {
    hits++;
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end('{"inPlace":true}\n');
  });
  const url = await listen(server);
  const poller = new RedirectStatusPoller({ url, intervalMs: 20 });
  try {
    poller.start();
    while (hits < 3) await new Promise((r) => setTimeout(r, 10));
    await poller.stop();
    const after = hits;
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(hits, after, 'no poll after stop');
    assert.equal(poller.status?.state, 'in-place');
  } finally {
    await poller.stop();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

test('--redirect-status-url: plain http only, no credentials; shown in config', () => {
  const base = ['--local', 'examples'];
  const ok = loadConfig([...base, '--redirect-status-url', 'http://127.0.0.1:8082/readyz'], {}, '/srv')!;
  assert.equal(ok.redirectStatusUrl, 'http://127.0.0.1:8082/readyz');
  assert.equal(configSummary(ok).redirectStatusUrl, 'http://127.0.0.1:8082/readyz');
  assert.equal(loadConfig(base, {}, '/srv')!.redirectStatusUrl, undefined);
  assert.throws(() => loadConfig([...base, '--redirect-status-url', 'https://x/readyz'], {}, '/srv'), /plain http/);
  assert.throws(
    () => loadConfig([...base, '--redirect-status-url', 'http://u:p@x/readyz'], {}, '/srv'),
    /without credentials/,
  );
  assert.throws(() => loadConfig([...base, '--redirect-status-url', 'not a url'], {}, '/srv'), /not a URL/);
});
