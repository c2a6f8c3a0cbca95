// The watch stream reader: events cut anywhere by the network (inside a
// multi-byte character, one byte at a time, a line of megabytes in many
// chunks) arrive whole and once; a line over the budget ends the watch.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { KubeConnection } from '../../src/kube/connection.ts';
import { BoundedWatch } from '../../src/kube/watch.ts';

// A server that writes `chunks` as one watch response, then ends it.
async function serve(t: { after(fn: () => Promise<void>): void }, write: (res: ServerResponse) => Promise<void>) {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.flushHeaders();
    void write(res).then(() => res.end());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const connection = new KubeConnection({ server: `http://127.0.0.1:${(server.address() as AddressInfo).port}` });
  t.after(async () => {
    await connection.close();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });
  return connection;
}

async function collect(watch: BoundedWatch): Promise<{ events: Array<[string, unknown]>; err: unknown }> {
  const events: Array<[string, unknown]> = [];
  return new Promise((resolve) => {
    void watch.watch(
      '/api/v1/namespaces/default/secrets',
      {},
      (type, obj) => events.push([type, obj]),
      (err) => resolve({ events, err }),
    );
  });
}

const pause = () => new Promise((r) => setImmediate(r));

test('events split anywhere arrive whole, once, in order', { timeout: 30_000 }, async (t) => {
  const big = 'é'.repeat(700_000); // 1.4 MB of two-byte characters
  const lines = [
    JSON.stringify({ type: 'ADDED', object: { metadata: { name: 'ünïcode' } } }),
    '',
    JSON.stringify({ type: 'MODIFIED', object: { data: big } }),
    'not json',
    JSON.stringify({ type: 'DELETED', object: { metadata: { name: 'last' } } }),
  ];
  const bytes = Buffer.from(lines.join('\n')); // the last line without a newline
  const connection = await serve(t, async (res) => {
    let at = 0;
    // One byte at a time through the first two lines, then odd-sized chunks.
    for (; at < 80; at++) {
      res.write(bytes.subarray(at, at + 1));
      await pause();
    }
    for (let size = 997; at < bytes.length; at += size) {
      res.write(bytes.subarray(at, at + size));
      if (at % 50 === 0) await pause();
    }
  });
  const { events, err } = await collect(new BoundedWatch({ connection }));
  assert.equal(err, null);
  assert.deepEqual(
    events.map(([type]) => type),
    ['ADDED', 'MODIFIED', 'DELETED'],
  );
  assert.deepEqual(events[0][1], { metadata: { name: 'ünïcode' } });
  assert.equal((events[1][1] as { data: string }).data, big);
  assert.deepEqual(events[2][1], { metadata: { name: 'last' } });
});

test('a line over the budget ends the watch with an error', { timeout: 30_000 }, async (t) => {
  const connection = await serve(t, async (res) => {
    res.write(JSON.stringify({ type: 'ADDED', object: {} }) + '\n');
    for (let i = 0; i < 64 && !res.destroyed; i++) {
      res.write('x'.repeat(1024));
      await pause();
    }
  });
  const { events, err } = await collect(new BoundedWatch({ connection, maxLineBytes: 16 * 1024 }));
  assert.deepEqual(
    events.map(([type]) => type),
    ['ADDED'],
  );
  assert.match(String((err as Error).message), /watch event over 16384 bytes/);
});
