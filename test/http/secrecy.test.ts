// The HTTP layer must only ever show the fields the status contract
// declares. The fake here behaves like a careless agent: its snapshot
// objects carry user-data, Secret content and a password in extra
// properties, and its readiness check fails with a message quoting them.
// None of it may reach a response body, a header or a log line, in any
// form a leak takes (base64 as the Secret data carries it, JSON-escaped,
// URL-encoded, HTML-escaped, hex: test/support/secret-forms.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import { FakeStatusSource, sampleSnapshot } from '../support/fake-status.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { fetchAll } from '../support/fetch-all.ts';
import { findSecret, secretForms } from '../support/secret-forms.ts';

const MARKER = `VMSEED-SECRET-${randomBytes(8).toString('hex')}`;
const FORMS = secretForms(MARKER);

function leakySnapshot() {
  const s: any = sampleSnapshot();
  s.userData = `#cloud-config\npassword: ${MARKER}`;
  s.config.kubeconfig = { token: MARKER }; // not a scalar: must be dropped
  s.watch.bearerToken = MARKER;
  s.queue.keys = [MARKER];
  for (const v of s.vmis) {
    v.userData = `#cloud-config\nchpasswd: {list: "root:${MARKER}"}`;
    v.secret = { data: { userdata: Buffer.from(MARKER).toString('base64'), password: MARKER } };
    v.seed = { userData: MARKER, metaData: { 'instance-id': MARKER } };
    for (const f of v.files ?? []) f.content = MARKER;
    if (v.injection) v.injection.diskXml = `<disk><source file="${MARKER}"/></disk>`;
    if (v.lastError) v.lastError.cause = new Error(MARKER);
    for (const w of v.warnings) w.detail = MARKER;
  }
  s.recentGenerations[0].key = MARKER;
  return s;
}

test('no route, header or log line ever shows data outside the status contract', async () => {
  const source = new FakeStatusSource(leakySnapshot());
  (source as any).userData = MARKER;
  source.readinessError = new Error(`could not read ${MARKER}`);
  const { logger, lines } = captureLogger('trace');
  const srv = await startHttpServer({
    listen: '127.0.0.1:0',
    metrics: createMetrics({ version: 't', processMetrics: false }),
    status: source,
    logger,
  });
  try {
    const routes = await fetchAll(srv.url);
    // The helper really did fetch pages with the VMIs on them.
    const paths = routes.map((r) => r.path);
    for (const p of [
      '/status',
      '/status.json',
      '/metrics',
      '/readyz',
      '/status/tenant-b/db-0',
      '/status/default/web-1',
    ])
      assert.ok(paths.includes(p), p);
    assert.ok(routes.find((r) => r.path === '/status/default/web-1')!.body.includes('>user-data</td>'));
    assert.equal(routes.find((r) => r.path === '/readyz')!.status, 503);

    // A query string with the marker is neither echoed nor logged.
    await (await fetch(`${srv.url}/status?state=error&password=${MARKER}`)).text();
    await (await fetch(`${srv.url}/status.json?token=${MARKER}`)).text();

    for (const r of routes) {
      const inBody = findSecret(r.body, FORMS);
      assert.equal(inBody, undefined, `${r.path} body leaks the marker (${inBody?.form})`);
      const inHeaders = findSecret(JSON.stringify(r.headers), FORMS);
      assert.equal(inHeaders, undefined, `${r.path} headers leak the marker (${inHeaders?.form})`);
    }
    assert.ok(lines.length > routes.length, 'request lines were logged');
    // The marker's query strings were logged as requests (the log is the one searched).
    assert.ok(lines.some((l) => l.includes('/status.json')) && lines.some((l) => l.includes('/metrics')));
    for (const l of lines) {
      const found = findSecret(l, FORMS);
      assert.equal(found, undefined, `log line leaks the marker (${found?.form}): ${l}`);
    }
  } finally {
    await srv.close();
  }
});
