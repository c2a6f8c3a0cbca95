// The webhook's certificate as a Secret volume holds it: files behind a
// `..data` symlink the kubelet swaps. A rotated pair is served without a
// restart; a broken one keeps the pair in force; a missing or expired one
// is a readiness problem with its reason.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rename, rm, symlink, writeFile } from 'node:fs/promises';
import { connect } from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { startWebhookServer } from '../../../src/cluster/webhook/webhook-server.ts';
import { waitFor } from '../../support/agent-harness.ts';
import { testPki, type TestPki } from '../../support/webhook.ts';

// Writes a pair as the kubelet does: a new timestamped directory, then an
// atomic swap of `..data` to it; tls.crt and tls.key are fixed symlinks
// through `..data`.
async function secretVolume(dir: string, pki: TestPki, n: number): Promise<void> {
  const data = join(dir, `..2026_11_25_00_00_0${n}`);
  await mkdir(data);
  await writeFile(join(data, 'tls.crt'), pki.serverCert);
  await writeFile(join(data, 'tls.key'), pki.serverKey);
  await symlink(`..2026_11_25_00_00_0${n}`, join(dir, '..data_tmp'));
  await rename(join(dir, '..data_tmp'), join(dir, '..data'));
}

// Whether a TLS client trusting only `ca` completes a handshake.
function trusts(port: number, ca: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port, ca, servername: 'localhost' }, () => {
      s.destroy();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  });
}

test('rotation by a ..data swap is served without a restart; a broken pair keeps the one in force', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-webhook-secret-'));
  const [one, two] = await Promise.all([testPki('webhook'), testPki('webhook-rotated')]);
  await secretVolume(dir, one, 1);
  await symlink('..data/tls.crt', join(dir, 'tls.crt'));
  await symlink('..data/tls.key', join(dir, 'tls.key'));
  const server = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: dir,
    logger: pino({ level: 'silent' }),
    mutate: {},
  });
  t.after(async () => {
    await server.close();
    await rm(dir, { recursive: true, force: true });
  });
  const port = server.address.port;
  assert.equal(server.problem(), undefined);
  assert.equal(await trusts(port, one.caCert), true);
  assert.equal(await trusts(port, two.caCert), false);

  await secretVolume(dir, two, 2);
  // The directory watch, not the 30 s poll.
  await waitFor('the rotated certificate served', async () => await trusts(port, two.caCert), 20_000);
  assert.equal(await trusts(port, one.caCert), false);

  // A key that does not match the certificate: refused, the pair in force stays.
  const broken = { ...two, serverKey: one.serverKey };
  await secretVolume(dir, broken, 3);
  await server.reloadCertificate();
  assert.equal(await trusts(port, two.caCert), true);
  assert.equal(server.problem(), undefined, 'the pair in force is valid');
});

test('missing, then expired: /readyz reasons name the files and the date', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-webhook-secret-'));
  let now = new Date();
  const server = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: dir,
    logger: pino({ level: 'silent' }),
    mutate: {},
    now: () => now,
  });
  t.after(async () => {
    await server.close();
    await rm(dir, { recursive: true, force: true });
  });
  assert.match(
    server.problem()!,
    new RegExp(`^webhook certificate missing: ${dir}/tls.crt or ${dir}/tls.key does not exist`),
  );
  const pki = await testPki('webhook');
  assert.equal(await trusts(server.address.port, pki.caCert), false, 'no certificate: no handshake');
  await writeFile(join(dir, 'tls.crt'), pki.serverCert);
  await writeFile(join(dir, 'tls.key'), pki.serverKey);
  await server.reloadCertificate();
  assert.equal(server.problem(), undefined);
  assert.equal(await trusts(server.address.port, pki.caCert), true);
  // The test PKI's certificates are valid for two days.
  now = new Date(Date.now() + 3 * 86_400_000);
  assert.match(server.problem()!, /^webhook certificate in .* expired at \d{4}-\d\d-\d\dT/);
  await writeFile(join(dir, 'tls.crt'), 'not a certificate');
  await server.reloadCertificate();
  assert.match(server.problem()!, /expired at .*; webhook certificate in .* is not a usable PEM certificate/);
});
