// --webhook-client-ca: the webhook answers only a client whose certificate
// the client CA signed (the API server's webhook client certificate), and,
// with --webhook-client-names, one of those names. The forged-review
// reproduction: a review sent by anyone else gets no HTTP answer at all
// (and without the flag, an answer whose serial opens nothing). The CA file
// is reloaded when it changes; a missing one fails /readyz naming the flag,
// and the process keeps running.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { Agent, request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { serialMinter } from '../../../src/commands/cluster/webhook.ts';
import { startWebhookServer, WEBHOOK_PATH } from '../../../src/cluster/webhook/webhook-server.ts';
import { loadClusterConfig } from '../../../src/config/cluster-config.ts';
import { ConfigError } from '../../../src/config/values.ts';
import { waitFor } from '../../support/agent-harness.ts';
import { readyz } from '../../support/agent-cli.ts';
import { startCliCluster } from '../../support/cluster-cli.ts';
import { certDir, clientPki, fixtureReview, patchOf, testPki, type Json } from '../../support/webhook.ts';

const BASE = 'http://169.254.169.254/v1';
const API_SERVER_CN = 'kube-apiserver-webhook-client';

type Outcome = { status: number; json?: Json } | { refused: string };

// POSTs a review as a client with `identity` (or none), trusting `ca` for
// the server. An answer, or how the connection failed before any.
function send(
  port: number,
  ca: string,
  body: string,
  identity?: { cert: string; key: string },
  agent: Agent | false = false,
): Promise<Outcome> {
  return new Promise((resolve) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        path: WEBHOOK_PATH,
        method: 'POST',
        ca,
        servername: 'localhost',
        ...(identity ?? {}),
        headers: { 'Content-Type': 'application/json' },
        agent,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          resolve({
            status: res.statusCode ?? 0,
            ...(res.headers['content-type'] === 'application/json' ? { json: JSON.parse(text) as Json } : {}),
          });
        });
        res.on('error', (e: NodeJS.ErrnoException) => resolve({ refused: e.code ?? e.message }));
      },
    );
    req.on('error', (e: NodeJS.ErrnoException) => resolve({ refused: e.code ?? e.message }));
    req.end(body);
  });
}

function assertAnswered(o: Outcome, what: string): Json {
  assert.ok('status' in o, `${what}: refused (${'refused' in o ? o.refused : ''})`);
  assert.equal(o.status, 200, what);
  assert.equal(o.json?.kind, 'AdmissionReview', what);
  return o.json;
}

function assertRefused(o: Outcome, what: string): void {
  assert.ok('refused' in o, `${what}: answered ${'status' in o ? o.status : ''}, should get no HTTP answer`);
}

const pkis = (async () => {
  const [server, apiServer, other] = await Promise.all([
    testPki('webhook'),
    clientPki('kube-apiserver-webhook-ca', [API_SERVER_CN, 'kubelet-node-1', 'by-san'], {
      'by-san': [API_SERVER_CN],
    }),
    clientPki('someone-else-ca', [API_SERVER_CN]),
  ]);
  return { server, apiServer, other };
})();

async function setup(
  t: { after(fn: () => Promise<void>): void },
  names?: string[],
  caText?: string,
  logger = pino({ level: 'silent' }),
) {
  const { server: pki, apiServer } = await pkis;
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-webhook-client-ca-'));
  const tls = await certDir(pki, dir);
  const caFile = join(dir, 'client-ca.crt');
  if (caText !== '') await writeFile(caFile, caText ?? apiServer.caCert);
  const server = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: tls,
    logger,
    mutate: { serials: serialMinter(BASE, 'nocloud-net') },
    clientAuth: { caFile, ...(names ? { names } : {}) },
  });
  t.after(async () => {
    await server.close();
    await rm(dir, { recursive: true, force: true });
  });
  return { server, caFile, port: server.address.port, serverCa: pki.caCert };
}

test("the API server's client certificate is answered; no certificate, or one from another CA: no HTTP answer at all", async (t) => {
  const { apiServer, other } = await pkis;
  const lines: Json[] = [];
  const logger = pino({ level: 'info' }, { write: (l: string) => void lines.push(JSON.parse(l) as Json) });
  const { server, port, serverCa } = await setup(t, undefined, undefined, logger);
  assert.equal(server.problem(), undefined);
  const body = JSON.stringify(await fixtureReview('vmi-direct'));

  const answered = assertAnswered(await send(port, serverCa, body, apiServer.clients[API_SERVER_CN]), 'API server');
  // The VMI has no firmware: the serial comes in a new firmware object.
  const firmware = patchOf({ status: 200, body: '', json: answered })?.find(
    (op) => op.path === '/spec/domain/firmware',
  );
  assert.match(
    String(firmware?.value?.serial),
    /^ds=nocloud-net;s=http:\/\/169\.254\.169\.254\/v1\/[A-Za-z0-9_-]{43}\/$/,
  );

  // The forged review: the same body from a client that is not the API server.
  assertRefused(await send(port, serverCa, body), 'no client certificate');
  // Logged (at most once a minute), so a misconfigured CA shows.
  const warned = await waitFor('the refusal logged', () =>
    lines.find((l) => l.msg?.startsWith('webhook client refused')),
  );
  assert.equal(warned.reason, 'no client certificate');
  assert.equal(warned.address, '127.0.0.1');
  assertRefused(await send(port, serverCa, body, other.clients[API_SERVER_CN]), 'same CN, another CA');
  // A client certificate the CA signed is enough without names.
  assertAnswered(await send(port, serverCa, body, apiServer.clients['kubelet-node-1']), 'another name, same CA');
  // The server keeps serving after refusals.
  assertAnswered(await send(port, serverCa, body, apiServer.clients[API_SERVER_CN]), 'API server again');
});

test('--webhook-client-names: a certificate of the same CA with another name gets no answer; a DNS name counts', async (t) => {
  const { apiServer } = await pkis;
  const { port, serverCa } = await setup(t, [API_SERVER_CN]);
  const body = JSON.stringify(await fixtureReview('vmi-direct'));
  assertAnswered(await send(port, serverCa, body, apiServer.clients[API_SERVER_CN]), 'the CN');
  assertAnswered(await send(port, serverCa, body, apiServer.clients['by-san']), 'a DNS name');
  assertRefused(await send(port, serverCa, body, apiServer.clients['kubelet-node-1']), 'a kubelet of the same CA');
  assertRefused(await send(port, serverCa, body), 'no certificate');
});

test('the CA file replaced (a ..data swap or an edit): new clients, and kept-alive ones, are checked against the new CA', async (t) => {
  const { apiServer, other } = await pkis;
  const { server, port, caFile, serverCa } = await setup(t);
  const body = JSON.stringify(await fixtureReview('vmi-direct'));
  const identity = apiServer.clients[API_SERVER_CN];
  const keepAlive = new Agent({ keepAlive: true, maxSockets: 1 });
  t.after(() => keepAlive.destroy());
  assertAnswered(await send(port, serverCa, body, identity, keepAlive), 'before');

  // Written beside and renamed over, as an atomic update is.
  await writeFile(`${caFile}.new`, other.caCert);
  await rename(`${caFile}.new`, caFile);
  // The directory watch, not the poll.
  await waitFor(
    'the new CA in force',
    async () => 'status' in (await send(port, serverCa, body, other.clients[API_SERVER_CN])),
    20_000,
  );
  assertRefused(await send(port, serverCa, body, identity), 'a client of the old CA');
  assertRefused(await send(port, serverCa, body, identity, keepAlive), 'a connection made under the old CA');

  // A bundle with both, as while moving from one CA to another.
  await writeFile(caFile, apiServer.caCert + other.caCert);
  await server.reloadCertificate();
  assertAnswered(await send(port, serverCa, body, identity), 'old CA in the bundle');
  assertAnswered(await send(port, serverCa, body, other.clients[API_SERVER_CN]), 'new CA in the bundle');

  // Not a certificate: the bundle in force stays, and readiness with it.
  await writeFile(caFile, 'not a certificate\n');
  await server.reloadCertificate();
  assert.equal(server.problem(), undefined);
  assertAnswered(await send(port, serverCa, body, identity), 'bundle in force');
});

test('a missing client CA: /readyz names the file and the flag, no handshake completes, and the file is taken up when it appears', async (t) => {
  const { apiServer } = await pkis;
  const { server, port, caFile, serverCa } = await setup(t, undefined, '');
  assert.equal(server.problem(), `webhook client CA missing: ${caFile} does not exist (--webhook-client-ca)`);
  const body = JSON.stringify(await fixtureReview('vmi-direct'));
  // The serving certificate is loaded, but nothing is served without the CA:
  // never the default root CAs, never any client.
  assertRefused(await send(port, serverCa, body, apiServer.clients[API_SERVER_CN]), 'no CA yet');
  assertRefused(await send(port, serverCa, body), 'no CA yet, no certificate');
  await writeFile(caFile, apiServer.caCert);
  await waitFor('the CA taken up', () => server.problem() === undefined, 20_000);
  assertAnswered(await send(port, serverCa, body, apiServer.clients[API_SERVER_CN]), 'CA loaded');
  assertRefused(await send(port, serverCa, body), 'CA loaded, no certificate');
});

test('vmseed cluster --webhook-client-ca with a missing file: /readyz says so, naming the flag; the process runs on', async (t) => {
  const { server: pki } = await pkis;
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-webhook-client-ca-cli-'));
  const tls = await certDir(pki, dir);
  const caFile = join(dir, 'ca', 'ca.crt');
  const cluster = startCliCluster(['--webhook-cert-dir', tls, '--webhook-client-ca', caFile]);
  t.after(async () => {
    await cluster.stop();
    await rm(dir, { recursive: true, force: true });
  });
  const probes = await cluster.probeUrl();
  const r = await waitFor('/readyz naming the client CA', async () => {
    const got = await readyz(probes);
    return got.status === 503 && got.body.includes('--webhook-client-ca') ? got : undefined;
  });
  assert.match(r.body, new RegExp(`webhook client CA missing: ${caFile} does not exist \\(--webhook-client-ca\\)`));
  assert.equal((await fetch(`${probes}/healthz`)).status, 200, 'alive while not ready');
});

test('flags: --webhook-client-ca (relative to cwd, or VMSEED_WEBHOOK_CLIENT_CA), --webhook-client-names only with it', () => {
  assert.equal(loadClusterConfig([], {}, '/')!.webhook.clientAuth, undefined);
  assert.deepEqual(loadClusterConfig(['--webhook-client-ca', 'ca.crt'], {}, '/w')!.webhook.clientAuth, {
    caFile: '/w/ca.crt',
  });
  assert.deepEqual(
    loadClusterConfig(
      ['--webhook-client-names', 'kube-apiserver, system:apiserver'],
      { VMSEED_WEBHOOK_CLIENT_CA: '/etc/ca/ca.crt' },
      '/',
    )!.webhook.clientAuth,
    { caFile: '/etc/ca/ca.crt', names: ['kube-apiserver', 'system:apiserver'] },
  );
  const cases: Array<[string[], RegExp]> = [
    [['--webhook-client-names', 'kube-apiserver'], /^--webhook-client-names: needs --webhook-client-ca/],
    [['--webhook-client-ca', 'c', '--webhook-client-names', 'a,,b'], /^--webhook-client-names: '' is not/],
    [['--webhook-client-ca', 'c', '--webhook-client-names', 'a b'], /^--webhook-client-names: 'a b' is not/],
  ];
  for (const [args, message] of cases) {
    assert.throws(
      () => loadClusterConfig(args, {}, '/'),
      (e: Error) => e instanceof ConfigError && message.test(e.message) && !e.message.includes('\n'),
      args.join(' '),
    );
  }
});
