// The webhook's metrics: every request counted by what came of it and
// timed, and the serving certificate's expiry exported as it is loaded and
// rotated.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { rm } from 'node:fs/promises';
import pino from 'pino';
import { createMetrics, type Metrics } from '../../../src/metrics/metrics.ts';
import { startWebhookServer } from '../../../src/cluster/webhook/webhook-server.ts';
import { certDir, fixtureReview, patchOf, post, testPki } from '../../support/webhook.ts';

async function counts(metrics: Metrics): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const v of (await metrics.webhookRequests.get()).values) out[String(v.labels.result)] = v.value;
  return out;
}

async function observed(metrics: Metrics): Promise<number> {
  const v = (await metrics.webhookRequestDuration.get()).values;
  return v.find((x) => x.metricName === 'vmseed_webhook_request_duration_seconds_count')?.value ?? 0;
}

const expiryOf = (pem: string) => new X509Certificate(pem).validToDate.getTime() / 1000;

test('requests by result (patched, unchanged, refused, error), each timed; certificate expiry follows the pair in force', async (t) => {
  const [pki, rotated] = await Promise.all([testPki('webhook'), testPki('webhook-metrics-rotated')]);
  const dir = await certDir(pki);
  const metrics = createMetrics({ version: 'test', processMetrics: false });
  let failMinting = false;
  const server = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: dir,
    logger: pino({ level: 'silent' }),
    metrics,
    mutate: {
      // A minter that breaks: the request is answered 500, not dropped.
      serials: {
        serial: () => {
          if (failMinting) throw new Error('no randomness');
          return 'ds=nocloud;s=http://169.254.169.254/v1/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/';
        },
        isOurs: () => false,
      },
    },
  });
  t.after(async () => {
    await server.close();
    await rm(dir, { recursive: true, force: true });
  });
  const port = server.address.port;
  assert.deepEqual(await counts(metrics), { patched: 0, unchanged: 0, refused: 0, error: 0 });
  assert.equal((await metrics.webhookCertificateExpiry.get()).values[0].value, expiryOf(pki.serverCert));

  const review = await fixtureReview('vmi-direct');
  assert.ok(patchOf(await post(port, pki.caCert, JSON.stringify(review)))!.length > 0);
  const other = { ...review, request: { ...review.request, operation: 'UPDATE' } };
  assert.equal(patchOf(await post(port, pki.caCert, JSON.stringify(other))), undefined);
  assert.equal((await post(port, pki.caCert, 'not json')).status, 400);
  assert.equal((await post(port, pki.caCert, JSON.stringify(review), { contentType: 'text/plain' })).status, 415);
  failMinting = true;
  assert.equal((await post(port, pki.caCert, JSON.stringify(review))).status, 500);
  assert.deepEqual(await counts(metrics), { patched: 1, unchanged: 1, refused: 2, error: 1 });
  assert.equal(await observed(metrics), 5);

  await certDir(rotated, dir);
  await server.reloadCertificate();
  assert.equal((await metrics.webhookCertificateExpiry.get()).values[0].value, expiryOf(rotated.serverCert));
});

test('no certificate loaded: the expiry gauge is 0', async (t) => {
  const metrics = createMetrics({ version: 'test', processMetrics: false });
  const server = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: '/nonexistent/vmseed-webhook-certs',
    logger: pino({ level: 'silent' }),
    metrics,
    mutate: {},
  });
  t.after(() => server.close());
  assert.match(server.problem() ?? '', /missing/);
  assert.equal((await metrics.webhookCertificateExpiry.get()).values[0]?.value ?? 0, 0);
});
