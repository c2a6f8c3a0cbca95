// A connection whose CA is a file the kubelet fills in later (a ConfigMap
// volume, optional, published by the cluster component): calls fail while
// the file is missing or names another CA, and succeed once it holds the
// server's, without a new connection object or a restart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:https';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { KubeConnection } from '../../src/kube/connection.ts';
import { KubeConnectionApi } from '../../src/kube/api-client.ts';
import { testPki } from '../support/test-pki.ts';

test('the CA file is read when it appears and re-read when it changes', { timeout: 30_000 }, async (t) => {
  const pki = await testPki('vmseed-ca-file');
  const other = await testPki('vmseed-ca-file-other');
  const server = createServer({ cert: pki.serverCert, key: pki.serverKey }, (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end('{"kind":"Status","status":"Success"}');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-ca-'));
  const caFile = join(dir, 'ca.crt');
  const conn = new KubeConnection({
    server: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
    token: 't',
    caFile,
    caRereadMs: 0,
  });
  t.after(async () => {
    await conn.close(100);
    server.close();
    await rm(dir, { recursive: true, force: true });
  });
  const api = new KubeConnectionApi(conn, { retry: { retries: 0 } });
  const call = () =>
    api.request('GET', '/api/v1/namespaces/x/secrets/y').then(
      (r) => r.status,
      (e: Error) => e.message,
    );

  assert.match(
    String(await call()),
    /no CA in .*ca\.crt yet|cannot|ECONN|fetch failed/i,
    'no file: refused, not thrown',
  );
  await writeFile(caFile, other.caCert);
  assert.notEqual(await call(), 200, 'another CA: the server is not trusted');
  await writeFile(caFile, pki.caCert);
  // A refused handshake leaves no connection open: the next call dials
  // again, with the file as it is now.
  assert.equal(await call(), 200);
});
