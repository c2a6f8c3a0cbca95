// The webhook listener under connections that never speak, with its
// defaults (what `vmseed cluster` runs): 64 silent TCP connections from one
// source are all cut within the header deadline (5 s; asserted loosely,
// under 10 s), TLS never having started on them, while AdmissionReviews from
// another source are answered all along. A connection that completes TLS and
// then says nothing is cut as well.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { rm } from 'node:fs/promises';
import { connect as tcpConnect, type Socket } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import pino from 'pino';
import { startWebhookServer, type WebhookServer } from '../../../src/cluster/webhook/webhook-server.ts';
import { certDir, fixtureReview, patchOf, post, testPki, type TestPki } from '../../support/webhook.ts';

const CUT_WITHIN_MS = 10_000;
let pki: TestPki;
let tls: string;
let server: WebhookServer;

before(async () => {
  pki = await testPki('webhook');
  tls = await certDir(pki);
  server = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: tls,
    logger: pino({ level: 'silent' }),
    mutate: {},
  });
});

after(async () => {
  await server?.close();
  if (tls) await rm(tls, { recursive: true, force: true });
});

// Resolves with the ms from the connect to the close (the server's doing:
// the client never writes nor ends).
function silent(socket: Socket, started: number): Promise<number> {
  return new Promise((resolve) => {
    socket.on('error', () => undefined);
    socket.once('close', () => resolve(performance.now() - started));
  });
}

test('64 silent TCP connections are cut within the deadline while reviews from another source are answered', async () => {
  const review = JSON.stringify(await fixtureReview('vmi-direct'));
  const started = performance.now();
  // Another loopback address: one source holding many connections, as an
  // attacker's pod would, apart from the API server's.
  const sockets = Array.from({ length: 64 }, () =>
    tcpConnect({ host: '127.0.0.1', port: server.address.port, localAddress: '127.0.0.2' }),
  );
  const closed = sockets.map((s) => silent(s, started));
  const guard = setTimeout(() => sockets.forEach((s) => s.destroy()), CUT_WITHIN_MS + 5_000);
  try {
    // Reviews, a few at a time, for as long as the silent sockets last.
    let answered = 0;
    let allClosed = false;
    void Promise.all(closed).then(() => (allClosed = true));
    while (!allClosed && performance.now() - started < CUT_WITHIN_MS + 5_000) {
      const answers = await Promise.all(Array.from({ length: 4 }, () => post(server.address.port, pki.caCert, review)));
      for (const a of answers) {
        assert.equal(a.status, 200, a.body);
        assert.ok(patchOf(a)!.length > 0, 'the review was answered with its patch');
      }
      answered += answers.length;
      await new Promise((r) => setTimeout(r, 100));
    }
    const times = await Promise.all(closed);
    const slowest = Math.max(...times);
    assert.ok(slowest < CUT_WITHIN_MS, `every silent connection cut within ${CUT_WITHIN_MS} ms; slowest ${slowest} ms`);
    assert.ok(answered >= 8, `reviews were answered while the silent connections were open (${answered})`);
  } finally {
    clearTimeout(guard);
  }
});

test('a connection that completes TLS and then sends nothing is cut within the deadline', async () => {
  const started = performance.now();
  const socket = tlsConnect({ host: '127.0.0.1', port: server.address.port, ca: pki.caCert, servername: 'localhost' });
  const closed = silent(socket, started);
  await new Promise<void>((resolve, reject) => {
    socket.once('secureConnect', resolve);
    socket.once('error', reject);
  });
  const guard = setTimeout(() => socket.destroy(), CUT_WITHIN_MS + 5_000);
  const ms = await closed;
  clearTimeout(guard);
  assert.ok(ms < CUT_WITHIN_MS, `cut after ${ms} ms`);
});
