// The object service's self-issued certificate against the fake API server:
// the Secret and the CA bundle ConfigMap are created, kept, renewed with the
// old certificate still trusted, settled between replicas by the API
// server's 409s, and an RBAC refusal names the rule that is missing.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import type { ConfigMapObject, SecretObject } from '../../../src/api/objects.ts';
import { KubeConnectionApi, type KubeApi } from '../../../src/kube/api-client.ts';
import {
  ensureServingCert,
  servingCertKeeper,
  type ServingCertOptions,
} from '../../../src/cluster/objects/serving-cert.ts';
import { VmseedError } from '../../../src/errors.ts';
import { FakeKube } from '../../support/fake-kube.ts';
import { namespacedRbac } from '../../support/kube-authz.ts';
import { captureLogger } from '../../support/capture-logger.ts';
import { waitFor } from '../../support/agent-harness.ts';

const ADMIN = 'admin-token';
const NS = 'vmseed';
const SECRET = 'vmseed-objects-tls';
const CM = 'vmseed-objects-ca';
const NAMES = ['vmseed-objects.vmseed.svc', 'vmseed-objects.vmseed.svc.cluster.local'];
const DAY_MS = 24 * 60 * 60 * 1000;

const options = (extra: Partial<ServingCertOptions> = {}): ServingCertOptions => ({
  namespace: NS,
  secretName: SECRET,
  configMapName: CM,
  dnsNames: NAMES,
  ...extra,
});

async function setup(t: TestContext) {
  const fake = await FakeKube.start({ adminTokens: [ADMIN] });
  const conns = [fake.connection(ADMIN)];
  t.after(async () => {
    for (const c of conns) await c.close(100);
    await fake.close();
  });
  const admin = new KubeConnectionApi(conns[0], { retry: { retries: 0 } });
  const ns = await admin.request('POST', '/api/v1/namespaces', {
    apiVersion: 'v1',
    kind: 'Namespace',
    metadata: { name: NS },
  });
  assert.equal(ns.status, 201);
  const client = (token = ADMIN) => {
    const conn = fake.connection(token);
    conns.push(conn);
    return new KubeConnectionApi(conn, { retry: { retries: 0 } });
  };
  // Writes to the Secret and ConfigMap, as `METHOD resource status`.
  const writes = () =>
    fake.requests
      .filter((r) => r.method !== 'GET' && (r.resource === 'secrets' || r.resource === 'configmaps'))
      .map((r) => `${r.method} ${r.resource} ${r.status}`);
  const secretOf = () => fake.getSecret(NS, SECRET);
  const bundleOf = async () => {
    const got = await admin.request('GET', `/api/v1/namespaces/${NS}/configmaps/${CM}`);
    assert.equal(got.status, 200);
    return pems((got.body as ConfigMapObject).data?.['ca.crt'] ?? '');
  };
  return { fake, admin, client, writes, secretOf, bundleOf };
}

const pems = (text: string) => text.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----\n/g) ?? [];
const decoded = (s: SecretObject | undefined, key: string) => Buffer.from(s?.data?.[key] ?? '', 'base64').toString();

test('absent: the Secret and the CA bundle ConfigMap are created; the key is never logged', async (t) => {
  const s = await setup(t);
  const { logger, lines } = captureLogger('debug');
  const got = await ensureServingCert(s.admin, options({ logger }));

  const secret = s.secretOf();
  assert.equal(secret?.type, 'kubernetes.io/tls');
  assert.equal(decoded(secret, 'tls.crt'), got.cert);
  assert.equal(decoded(secret, 'tls.key'), got.key);
  assert.deepEqual(pems(decoded(secret, 'ca.crt')), [got.cert]);
  assert.deepEqual(await s.bundleOf(), [got.cert], 'ca.crt is the certificate');
  assert.deepEqual(s.writes(), ['POST secrets 201', 'POST configmaps 201']);

  const x = new X509Certificate(got.cert);
  assert.equal(x.subjectAltName, NAMES.map((n) => `DNS:${n}`).join(', '));
  assert.equal(x.ca, true);
  assert.equal(got.notAfter.getTime(), new Date(x.validTo).getTime());
  const days = (got.notAfter.getTime() - Date.now()) / DAY_MS;
  assert.ok(days > 364 && days <= 365, `valid for 365 days by default (${days})`);

  const logged = lines.join('\n');
  assert.match(logged, /object service certificate issued/);
  assert.match(logged, /object service CA bundle published/);
  assert.doesNotMatch(logged, /PRIVATE KEY/);
  const keyBase64 = secret?.data?.['tls.key'] ?? '';
  assert.ok(keyBase64 !== '' && !logged.includes(keyBase64), 'the key is not logged base64 either');
});

test('a valid certificate is kept: no write', async (t) => {
  const s = await setup(t);
  const first = await ensureServingCert(s.admin, options());
  const before = s.writes().length;
  const again = await ensureServingCert(s.client(ADMIN), options());
  assert.deepEqual(again, first);
  assert.equal(s.writes().length, before, 'nothing written');
});

test('renewed within renewBeforeDays: the bundle holds the new and the old until the old expires', async (t) => {
  const s = await setup(t);
  const t0 = Date.now();
  const old = await ensureServingCert(s.admin, options({ validDays: 100, renewBeforeDays: 10 }));
  const at = (days: number) => () => new Date(t0 + days * DAY_MS);

  const early = await ensureServingCert(s.admin, options({ validDays: 100, renewBeforeDays: 10, now: at(89) }));
  assert.equal(early.cert, old.cert, 'not yet within 10 days of expiry');

  const { logger, lines } = captureLogger('info');
  const renewed = await ensureServingCert(
    s.admin,
    options({ validDays: 100, renewBeforeDays: 10, now: at(91), logger }),
  );
  assert.notEqual(renewed.cert, old.cert);
  assert.equal(decoded(s.secretOf(), 'tls.crt'), renewed.cert);
  assert.deepEqual(await s.bundleOf(), [renewed.cert, old.cert], 'new first, the old one still trusted');
  assert.match(
    lines.join('\n'),
    /"reason":"its certificate expires at [^"]+".*"msg":"object service certificate renewed"/,
  );
  const put = s.fake.requests.find((r) => r.method === 'PUT' && r.resource === 'secrets');
  assert.equal(put?.status, 200, 'replaced in place');

  // Once the old one expired it leaves the bundle; the Secret stays as it is.
  const writes = s.writes().length;
  const later = await ensureServingCert(s.admin, options({ validDays: 100, renewBeforeDays: 10, now: at(101) }));
  assert.equal(later.cert, renewed.cert);
  assert.deepEqual(await s.bundleOf(), [renewed.cert]);
  assert.deepEqual(s.writes().slice(writes), ['PUT configmaps 200']);
});

test('a Secret that is unusable or names other hosts is replaced; a deleted ConfigMap comes back', async (t) => {
  const s = await setup(t);
  s.fake.setSecret({
    metadata: { name: SECRET, namespace: NS },
    type: 'kubernetes.io/tls',
    stringData: { 'tls.crt': 'not a certificate', 'tls.key': 'nor a key' },
  });
  const first = await ensureServingCert(s.admin, options());
  assert.equal(decoded(s.secretOf(), 'tls.crt'), first.cert);
  assert.deepEqual(await s.bundleOf(), [first.cert], 'nothing unparseable in the bundle');

  const moved = await ensureServingCert(s.admin, options({ dnsNames: ['objects.vmseed.example'] }));
  assert.notEqual(moved.cert, first.cert);
  assert.equal(new X509Certificate(moved.cert).subjectAltName, 'DNS:objects.vmseed.example');

  s.fake.deleteConfigMap(NS, CM);
  const same = await ensureServingCert(s.admin, options({ dnsNames: ['objects.vmseed.example'] }));
  assert.equal(same.cert, moved.cert);
  assert.deepEqual(await s.bundleOf(), [moved.cert, first.cert], 'rebuilt from the Secret alone');
});

// Two replicas' clients whose first Secret write waits until both have read
// the Secret: the race the API server settles, every time.
function racing(make: () => KubeApi): [KubeApi, KubeApi] {
  let reads = 0;
  let bothRead!: () => void;
  const gate = new Promise<void>((r) => (bothRead = r));
  const one = (): KubeApi => {
    const api = make();
    let first = true;
    return {
      request: async (method, path, ...rest) => {
        if (method !== 'GET' && path.includes('/secrets') && first) {
          first = false;
          await gate;
        }
        const res = await api.request(method, path, ...rest);
        if (method === 'GET' && path.includes('/secrets/') && ++reads === 2) bothRead();
        return res;
      },
    };
  };
  return [one(), one()];
}

test('two replicas at once end with the same certificate', async (t) => {
  const s = await setup(t);
  const [r1, r2] = racing(() => s.client());
  const [a, b] = await Promise.all([ensureServingCert(r1, options()), ensureServingCert(r2, options())]);
  assert.equal(a.cert, b.cert);
  assert.equal(a.key, b.key);
  assert.equal(decoded(s.secretOf(), 'tls.crt'), a.cert);
  assert.deepEqual(await s.bundleOf(), [a.cert]);
  const secretWrites = s.writes().filter((w) => w.includes('secrets'));
  assert.deepEqual(secretWrites.sort(), ['POST secrets 201', 'POST secrets 409'], 'both tried; one create won');

  // And renewing at once: one replace wins, the other's is a 409 Conflict.
  const now = () => new Date(Date.now() + 350 * DAY_MS);
  const [r3, r4] = racing(() => s.client());
  const [c, d] = await Promise.all([ensureServingCert(r3, options({ now })), ensureServingCert(r4, options({ now }))]);
  assert.equal(c.cert, d.cert);
  assert.notEqual(c.cert, a.cert);
  assert.deepEqual(await s.bundleOf(), [c.cert, a.cert]);
  const puts = s.writes().filter((w) => w.startsWith('PUT secrets'));
  assert.deepEqual(puts.sort(), ['PUT secrets 200', 'PUT secrets 409']);
});

test('a 403 is a typed error that names the RBAC rule missing', async (t) => {
  const s = await setup(t);
  // The agent's own token: its RBAC grants nothing in this namespace.
  s.fake.setRbac(namespacedRbac(['tenant']));
  const refused = await ensureServingCert(s.client('fake-token'), options()).then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(refused instanceof VmseedError, String(refused));
  assert.equal(refused.code, 'KUBE_API_FORBIDDEN');
  assert.equal(refused.kind, 'terminal');
  assert.equal(refused.field, `secrets/${SECRET}`);
  assert.match(refused.message, new RegExp(`verbs get and update on secrets with resourceNames \\["${SECRET}"\\]`));
  assert.match(refused.message, /and create on secrets/);
  assert.match(refused.message, /cannot get resource "secrets"/, "the API server's own reason");

  // Granted the Secret as the message says, not the ConfigMap: the next 403 names that.
  s.fake.setRbac(
    namespacedRbac(
      [NS],
      [
        { apiGroups: [''], resources: ['secrets'], resourceNames: [SECRET], verbs: ['get', 'update'] },
        { apiGroups: [''], resources: ['secrets'], verbs: ['create'] },
      ],
    ),
  );
  const cm = await ensureServingCert(s.client('fake-token'), options()).then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(cm instanceof VmseedError, String(cm));
  assert.equal(cm.code, 'KUBE_API_FORBIDDEN');
  assert.equal(cm.field, `configmaps/${CM}`);
  assert.match(cm.message, new RegExp(`configmaps with resourceNames \\["${CM}"\\]`));
  assert.ok(s.secretOf(), 'the Secret was written under the rule the first message named');

  // A failure other than 403 is retryable.
  s.fake.setRbac(false);
  s.fake.fail({ status: 503, path: /\/secrets\// });
  const down = await ensureServingCert(s.client('fake-token'), options()).then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(down instanceof VmseedError, String(down));
  assert.equal(down.retryable, true);
});

test('the keeper puts a certificate another replica renewed into service, and reports failures', async (t) => {
  const s = await setup(t);
  const first = await ensureServingCert(s.admin, options());
  const seen: string[] = [];
  const { logger, lines } = captureLogger('info');
  const keeper = servingCertKeeper({
    ...options(),
    api: s.client(),
    logger,
    intervalMs: 50,
    current: first.cert,
    onCert: (cert, key) => {
      assert.ok(new X509Certificate(cert).checkPrivateKey(createPrivateKey(key)));
      seen.push(cert);
    },
  });
  keeper.start();
  t.after(() => keeper.stop());

  await new Promise((r) => setTimeout(r, 200));
  assert.deepEqual(seen, [], 'the certificate in force is not handed over again');

  // Another replica renews.
  const renewed = await ensureServingCert(s.admin, options({ now: () => new Date(Date.now() + 340 * DAY_MS) }));
  await waitFor('the renewed certificate put into service', () => seen.length === 1);
  assert.equal(seen[0], renewed.cert);

  s.fake.setRbac(namespacedRbac(['tenant']));
  const agentKeeper = servingCertKeeper({
    ...options(),
    api: s.client('fake-token'),
    logger,
    intervalMs: 50,
    onCert: () => assert.fail('no certificate without access'),
  });
  await agentKeeper.refresh();
  assert.match(agentKeeper.problem() ?? '', /resourceNames/);
  assert.match(lines.join('\n'), /object service certificate check failed; keeping the one in force/);
  agentKeeper.stop();
  keeper.stop();
  const count = seen.length;
  await new Promise((r) => setTimeout(r, 150));
  assert.equal(seen.length, count, 'stopped');
});
