// One bad client cannot take the datasource from every guest: 1,100
// connections from 127.0.0.1 that send half a request line and stop (more
// than the listener's 1,024-connection cap: without a per-source cap they
// would fill it) while a guest on 127.0.0.2 fetches its seed. Then every
// connection the bad client got is closed by the header timeout, within
// seconds, not Node's default 30 s check interval, even though the client
// never reads the answer.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { connect, type Socket } from 'node:net';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { startDatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { datasourceSeedUrl } from '../../src/datasource/url.ts';
import { waitFor } from '../support/agent-harness.ts';
import { MapDirectory, nocloudSeed, quietLogger, randomKey } from './datasource-fixtures.ts';

const FLOOD = 1100;

function getFrom(localAddress: string, url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { localAddress, agent: false, timeout: 10_000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('timeout', () => req.destroy(new Error('guest request timed out')));
    req.on('error', reject);
    req.end();
  });
}

// Resolves once the socket is connected (or failed to); records when it
// closed. It never reads: what a hostile client would do.
function halfOpen(port: number, closedAt: Map<Socket, number>): Promise<Socket> {
  return new Promise((resolve) => {
    const s = connect({ port, host: '127.0.0.1', localAddress: '127.0.0.1' });
    s.on('error', () => {});
    s.on('close', () => closedAt.set(s, performance.now()));
    s.on('connect', () => {
      s.write('GET /v1/');
      resolve(s);
    });
    s.on('close', () => resolve(s));
  });
}

test(
  '1,100 half-open connections from one source: guests on another address are served; the held ones time out in seconds',
  { timeout: 120_000 },
  async (t) => {
    const dir = new MapDirectory();
    const keyring = new DatasourceKeyring([randomKey()]);
    dir.add({ namespace: 'default', name: 'guest', uid: 'uid-guest', seed: nocloudSeed('guest') });
    const metrics = createMetrics({ version: 't', processMetrics: false });
    const server = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: quietLogger,
      metrics,
    });
    const sockets: Socket[] = [];
    t.after(async () => {
      for (const s of sockets) s.destroy();
      await server.close();
    });
    const seedUrl = datasourceSeedUrl(server.baseUrl, keyring.sign('uid-guest'));

    const closedAt = new Map<Socket, number>();
    const floodStart = performance.now();
    for (let i = 0; i < FLOOD; i += 100) {
      sockets.push(...(await Promise.all(Array.from({ length: 100 }, () => halfOpen(server.address.port, closedAt)))));
    }
    const refused = async () =>
      (await metrics.registry.getSingleMetric('vmseed_datasource_connections_refused_total')!.get()).values[0]?.value ??
      0;
    // The source's share is open; everything beyond it was closed on arrival.
    await waitFor('connections over the share closed', async () => (await refused()) >= FLOOD - 32, 20_000);
    // (Counted on the server: a client that never reads may not see its own closes.)
    const held = FLOOD - (await refused());
    assert.equal(held, 32, `the bad source holds ${held} connections`);

    // While it holds them: a guest from another address gets its seed, every file.
    for (const f of ['meta-data', 'user-data', 'vendor-data']) {
      const r = await getFrom('127.0.0.2', `${seedUrl}${f}`);
      assert.equal(r.status, 200, f);
      if (f === 'user-data') assert.match(r.body, /hostname: host-guest/);
    }
    // The bad source's own new connections are refused while its share is full.
    const before = await refused();
    sockets.push(await halfOpen(server.address.port, closedAt));
    await waitFor('one more refused', async () => (await refused()) === before + 1, 20_000);

    // The header timeout frees the server's side of every held connection
    // (the bad client never reads, so its own sockets may never notice):
    // the same source is then served again. No tight bound: Node's default
    // check interval alone would take 30 s or more.
    await waitFor(
      'the bad source served again',
      async () => (await getFrom('127.0.0.1', `${seedUrl}meta-data`).catch(() => ({ status: 0 }))).status === 200,
      60_000,
    );
    const seconds = (performance.now() - floodStart) / 1000;
    t.diagnostic(
      `the bad source held ${held} of ${FLOOD} connections; its slots were free again ${seconds.toFixed(1)} s after the flood started`,
    );
    assert.ok(seconds < 30, `slots freed after ${seconds.toFixed(1)} s`);
  },
);
