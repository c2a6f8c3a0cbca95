// KubeVirt IMDS's /v1/identity and /v1/token on the real datasource
// listener: IMDS's JSON shapes and status codes, its request guards kept
// per VM, and two VMs on one node that never get each other's token,
// whatever headers or paths one of them tries. Tokens come from a pods
// tree laid out as the kubelet's atomic writer lays out projected volumes,
// read by the agent's own reader.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, rename, symlink, unlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { jwtExpiration } from '../../src/datasource/imds/token-endpoint.ts';
import { launcherTokenReader } from '../../src/agent/domain/launcher-token.ts';
import pino from 'pino';
import { Client } from 'undici';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { MapDirectory, nocloudSeed, quietLogger, randomKey } from './datasource-fixtures.ts';
import { TIMESTAMP_DIR, entry, facts, get, jwt, launcherJwt, projectedToken } from './imds-support.ts';

const POD_A = '11111111-1111-4111-8111-111111111111';
const POD_B = '22222222-2222-4222-8222-222222222222';
const POD_C = '33333333-3333-4333-8333-333333333333';
const TOKEN_A = launcherJwt(
  { exp: 1_700_000_000, sub: 'system:serviceaccount:tenant:sa-a' },
  { namespace: 'tenant', serviceAccount: 'sa-a', pod: POD_A },
);
const TOKEN_B = launcherJwt(
  { exp: 1_800_000_000, sub: 'system:serviceaccount:tenant:sa-b' },
  { namespace: 'tenant', serviceAccount: 'sa-b', pod: POD_B },
);
const MD = { Metadata: 'true' };

let server: DatasourceServer;
let port: number;
let podsDir: string;
let nowMs = 0;
const keyring = new DatasourceKeyring([randomKey()]);
const dir = new MapDirectory();
const metrics = createMetrics({ version: 'test', processMetrics: false });

before(async () => {
  podsDir = await mkdtemp(join(tmpdir(), 'vmseed-pods-'));
  await projectedToken(podsDir, POD_A, TOKEN_A);
  await projectedToken(podsDir, POD_B, TOKEN_B);
  const sa = (name: string, pod: string) =>
    facts({ serviceAccountName: name, serviceAccountToken: true, launcherPods: [pod] });
  // a and b: IMDS VMIs by source address; c: opted in, token path only, no
  // ServiceAccount volume; d: a plain vmseed VMI (not opted in).
  dir.add(entry('a', nocloudSeed('a', { delivery: 'http' }), sa('sa-a', POD_A)), ['127.0.0.1']);
  dir.add(entry('b', nocloudSeed('b', { delivery: 'http' }), sa('sa-b', POD_B)), ['127.0.0.2']);
  dir.add(entry('c', nocloudSeed('c'), facts({ launcherPods: [POD_C] })));
  dir.add(entry('d', nocloudSeed('d'), facts({ enabled: false })), ['127.0.0.4']);
  server = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: dir,
    keyring,
    logger: quietLogger,
    metrics,
    compatSourceAddress: true,
    readServiceAccountToken: launcherTokenReader(podsDir),
    // Time stands still unless a test moves it: buckets refill only then.
    clock: { now: () => new Date(), monotonicMs: () => nowMs },
    limits: { ratePerSecond: 1_000_000, burst: 1_000_000 },
  });
  port = server.address.port;
});

after(async () => {
  await server.close();
  await rm(podsDir, { recursive: true, force: true });
});

// Each test starts with full buckets.
function refill(): void {
  nowMs += 10_000;
}

test('identity by source address: IMDS JSON, exact bytes', { timeout: 30_000 }, async () => {
  refill();
  const r = await get(port, '/v1/identity', MD, '127.0.0.1');
  assert.equal(r.status, 200);
  assert.equal(r.headers['content-type'], 'application/json');
  assert.equal(r.headers['cache-control'], 'no-store');
  assert.equal(r.body, '{"namespace":"tenant","serviceAccountName":"sa-a","vmName":"a"}\n');
  const b = await get(port, '/v1/identity', MD, '127.0.0.2');
  assert.equal(JSON.parse(b.body).vmName, 'b');
});

test('Metadata header: missing, wrong or repeated is IMDS 400 missing_header', { timeout: 30_000 }, async () => {
  refill();
  const wrong: Array<Record<string, string | string[]>> = [
    {},
    { Metadata: 'false' },
    { Metadata: 'TRUE' },
    { Metadata: ['true', 'true'] },
  ];
  for (const headers of wrong) {
    for (const path of ['/v1/identity', '/v1/token']) {
      const r = await get(port, path, headers, '127.0.0.1');
      assert.equal(r.status, 400, `${path} ${JSON.stringify(headers)}`);
      assert.deepEqual(JSON.parse(r.body), { error: 'missing_header', message: 'Metadata: true header is required' });
      assert.ok(!r.body.includes(TOKEN_A));
    }
  }
});

test('token: the launcher pod token with exp from the JWT, IMDS shape', { timeout: 30_000 }, async () => {
  refill();
  const r = await get(port, '/v1/token', MD, '127.0.0.1');
  assert.equal(r.status, 200);
  assert.equal(r.body, `{"token":"${TOKEN_A}","expirationTimestamp":"2023-11-14T22:13:20Z"}\n`);
  const b = await get(port, '/v1/token', MD, '127.0.0.2');
  assert.deepEqual(JSON.parse(b.body), { token: TOKEN_B, expirationTimestamp: '2027-01-15T08:00:00Z' });
});

test('two VMs on one node: A never gets B token by forged headers or addresses', { timeout: 60_000 }, async () => {
  refill();
  // The forwarding headers are refused outright (forwarded-headers.test.ts).
  for (const h of [
    { 'X-Forwarded-For': '127.0.0.2' } as Record<string, string>,
    { Forwarded: 'for=127.0.0.2' },
    { 'X-Forwarded-For': '127.0.0.2, 127.0.0.1', 'X-Original-Forwarded-For': '127.0.0.2' },
  ]) {
    const r = await get(port, '/v1/token', { ...MD, ...h }, '127.0.0.1');
    assert.equal(r.status, 400, JSON.stringify(h));
    assert.ok(!r.body.includes(TOKEN_A) && !r.body.includes(TOKEN_B));
  }
  const forged: Array<Record<string, string>> = [
    { 'X-Real-IP': '127.0.0.2' },
    { 'X-Original-Forwarded-For': '127.0.0.2' },
    { Host: '127.0.0.2' },
  ];
  for (const h of forged) {
    const r = await get(port, '/v1/token', { ...MD, ...h }, '127.0.0.1');
    assert.equal(r.status, 200);
    assert.equal(JSON.parse(r.body).token, TOKEN_A, JSON.stringify(h));
    assert.ok(!r.body.includes(TOKEN_B));
  }
  // No VMI at this address; a VMI not opted in; B's UID as a path: nothing.
  for (const [path, from] of [
    ['/v1/token', '127.0.0.3'],
    ['/v1/token', '127.0.0.4'],
    ['/v1/uid-b/token', '127.0.0.1'],
    ['/v1/token?vm=b', '127.0.0.1'],
    ['/v1//token', '127.0.0.1'],
    ['/v1/%74oken', '127.0.0.1'],
  ] as const) {
    const r = await get(port, path, MD, from);
    assert.equal(r.status, 404, `${path} from ${from}`);
    assert.ok(!r.body.includes(TOKEN_A) && !r.body.includes(TOKEN_B));
  }
  // Two VMIs reporting one address: neither is answered.
  dir.addresses.set('127.0.0.5', ['uid-a', 'uid-b']);
  assert.equal((await get(port, '/v1/token', MD, '127.0.0.5')).status, 404);
});

test('token path: the VMI the token is signed for, opted-in VMIs only', { timeout: 30_000 }, async () => {
  refill();
  const a = await get(port, `/v1/${keyring.sign('uid-a')}/token`, MD, '127.0.0.2');
  assert.equal(JSON.parse(a.body).token, TOKEN_A, "the token is the caller's identity, not its address");
  const c = await get(port, `/v1/${keyring.sign('uid-c')}/identity`, MD, '127.0.0.9');
  assert.equal(c.body, '{"namespace":"tenant","serviceAccountName":"default","vmName":"c"}\n');
  // c has no serviceAccount volume: IMDS's token_unavailable.
  const ct = await get(port, `/v1/${keyring.sign('uid-c')}/token`, MD, '127.0.0.9');
  assert.equal(ct.status, 500);
  assert.deepEqual(JSON.parse(ct.body), { error: 'token_unavailable', message: 'Failed to read ServiceAccount token' });
  // d is not opted in: 404, as for an unknown token.
  assert.equal((await get(port, `/v1/${keyring.sign('uid-d')}/identity`, MD)).status, 404);
  assert.equal((await get(port, `/v1/${'A'.repeat(43)}/identity`, MD)).status, 404);
});

test(
  'token file: rotation followed, symlinks planted by the pod refused, missing is 500',
  { timeout: 30_000 },
  async () => {
    refill();
    const volA = join(podsDir, POD_A, 'volumes', 'kubernetes.io~projected', 'kube-api-access-x7k2p');
    const volB = join(podsDir, POD_B, 'volumes', 'kubernetes.io~projected', 'kube-api-access-x7k2p');
    const tokenOf = async () => {
      const r = await get(port, '/v1/token', MD, '127.0.0.2');
      assert.ok(!r.body.includes(TOKEN_A), 'B must never get A token');
      return r;
    };
    // ..data pointing into A's volume (outside B's own directory): refused.
    await unlink(join(volB, '..data'));
    await symlink(join(volA, TIMESTAMP_DIR), join(volB, '..data'));
    assert.equal((await tokenOf()).status, 500);
    await unlink(join(volB, '..data'));
    await symlink(
      `../../../../${POD_A}/volumes/kubernetes.io~projected/kube-api-access-x7k2p/${TIMESTAMP_DIR}`,
      join(volB, '..data'),
    );
    assert.equal((await tokenOf()).status, 500);
    // The timestamped directory itself a symlink to A's: refused.
    await unlink(join(volB, '..data'));
    await rename(join(volB, TIMESTAMP_DIR), join(volB, '..2026_11_25_23_00_00.keep'));
    await symlink(join(volA, TIMESTAMP_DIR), join(volB, TIMESTAMP_DIR));
    await symlink(TIMESTAMP_DIR, join(volB, '..data'));
    assert.equal((await tokenOf()).status, 500);
    // The token file a symlink to A's token: refused.
    await unlink(join(volB, TIMESTAMP_DIR));
    await unlink(join(volB, '..data'));
    await rename(join(volB, '..2026_11_25_23_00_00.keep'), join(volB, TIMESTAMP_DIR));
    await rename(join(volB, TIMESTAMP_DIR, 'token'), join(volB, TIMESTAMP_DIR, 'token.keep'));
    await symlink(join(volA, TIMESTAMP_DIR, 'token'), join(volB, TIMESTAMP_DIR, 'token'));
    await symlink(TIMESTAMP_DIR, join(volB, '..data'));
    assert.equal((await tokenOf()).status, 500);
    // The volume directory a symlink to A's volume: refused.
    const aside = `${volB}.aside`;
    await rename(volB, aside);
    await symlink(volA, volB);
    assert.equal((await tokenOf()).status, 500);
    await unlink(volB);
    await rename(aside, volB);
    // Restored: B's own token, then a rotation (a new timestamped directory).
    await unlink(join(volB, TIMESTAMP_DIR, 'token'));
    await rename(join(volB, TIMESTAMP_DIR, 'token.keep'), join(volB, TIMESTAMP_DIR, 'token'));
    assert.equal(JSON.parse((await tokenOf()).body).token, TOKEN_B);
    const rotated = launcherJwt({ exp: 1_900_000_000 }, { namespace: 'tenant', serviceAccount: 'sa-b', pod: POD_B });
    await projectedToken(join(podsDir, 'rotation'), POD_B, rotated);
    const fresh = join(podsDir, 'rotation', POD_B, 'volumes', 'kubernetes.io~projected', 'kube-api-access-x7k2p');
    await rename(join(fresh, TIMESTAMP_DIR), join(volB, '..2026_11_26_00_00_00.1'));
    await unlink(join(volB, '..data'));
    await symlink('..2026_11_26_00_00_00.1', join(volB, '..data'));
    assert.equal(JSON.parse((await tokenOf()).body).token, rotated, 'never cached: the rotated token at once');
    // Gone altogether: IMDS's 500.
    await rm(join(podsDir, POD_B), { recursive: true });
    assert.equal((await tokenOf()).status, 500);
    await projectedToken(podsDir, POD_B, TOKEN_B);
  },
);

test('rate limit per VM: A flooding gets 429 Retry-After 1, B is not limited', { timeout: 60_000 }, async () => {
  refill();
  const statuses: number[] = [];
  for (let i = 0; i < 101; i++) statuses.push((await get(port, '/v1/identity', MD, '127.0.0.1')).status);
  assert.equal(statuses.filter((s) => s === 200).length, 100, 'burst 100');
  const r = await get(port, '/v1/identity', MD, '127.0.0.1');
  assert.equal(r.status, 429);
  assert.equal(r.headers['retry-after'], '1');
  assert.equal(r.body, 'rate limit exceeded\n');
  // Headerless requests draw on the same bucket.
  assert.equal((await get(port, '/v1/identity', {}, '127.0.0.1')).status, 429);
  assert.equal((await get(port, '/v1/identity', MD, '127.0.0.2')).status, 200, 'B has its own bucket');
  assert.equal((await get(port, `/v1/${keyring.sign('uid-a')}/identity`, MD, '127.0.0.2')).status, 429, 'by VMI');
  nowMs += 50; // 100/s: five tokens back
  const after = [];
  for (let i = 0; i < 6; i++) after.push((await get(port, '/v1/identity', MD, '127.0.0.1')).status);
  assert.deepEqual(after, [200, 200, 200, 200, 200, 429]);
  const text = await metrics.registry.metrics();
  assert.match(text, /vmseed_imds_rate_limited_total\{family="identity",scope="vm"\} [1-9]/);
  assert.match(text, /vmseed_imds_requests_total\{family="identity",status="429"\} [1-9]/);
  // The listener's own count files them as imds, not as other.
  assert.match(text, /vmseed_datasource_requests_total\{endpoint="imds",status="429"\} [1-9]/);
  assert.match(text, /vmseed_imds_requests_total\{family="token",status="200"\} [1-9]/);
});

test(
  'a VM its bucket refused is not read on that connection for Retry-After; B is answered meanwhile',
  { timeout: 60_000 },
  async () => {
    refill();
    // One keep-alive connection from VM A, as a flooding guest would hold.
    const a = new Client(`http://127.0.0.1:${port}`, { localAddress: '127.0.0.1', pipelining: 1 });
    const ask = async (c: Client) => {
      const r = await c.request({ path: '/v1/identity', method: 'GET', headers: MD });
      await r.body.arrayBuffer();
      return { status: r.statusCode, at: performance.now() };
    };
    try {
      for (let i = 0; i < 100; i++) assert.equal((await ask(a)).status, 200);
      const refused = await ask(a);
      assert.equal(refused.status, 429);
      const next = ask(a);
      const b = await get(port, '/v1/identity', MD, '127.0.0.2');
      const bAt = performance.now();
      assert.equal(b.status, 200, "B's own connection and bucket");
      const held = await next;
      assert.ok(bAt < held.at, 'B answered while A was held');
      // The bucket's clock stands still here: A is still refused, a second later.
      assert.equal(held.status, 429);
      assert.ok(held.at - refused.at >= 500, `A's next answer ${(held.at - refused.at).toFixed(0)} ms after its 429`);
    } finally {
      await a.destroy();
    }
  },
);

test('guards: 1 KiB of headers, GET/HEAD only, no body', { timeout: 30_000 }, async () => {
  refill();
  const big = await get(port, '/v1/identity', { ...MD, 'X-Pad': 'p'.repeat(1000) }, '127.0.0.1');
  assert.equal(big.status, 431);
  const fits = await get(port, '/v1/identity', { ...MD, 'X-Pad': 'p'.repeat(700) }, '127.0.0.1');
  assert.equal(fits.status, 200);
  const post = await get(port, '/v1/identity', MD, '127.0.0.1', 'POST');
  assert.equal(post.status, 405);
  assert.equal(post.body, 'Method not allowed\n');
  const head = await get(port, '/v1/token', MD, '127.0.0.1', 'HEAD');
  assert.equal(head.status, 200);
  assert.equal(head.body, '');
});

test('jwtExpiration: the cases of IMDS parseJWTExpiration', () => {
  assert.equal(jwtExpiration(jwt({ exp: 1_700_000_000 })), '2023-11-14T22:13:20Z');
  assert.equal(jwtExpiration(jwt({ exp: 1_800_000_000, iat: 1_700_000_000 })), '2027-01-15T08:00:00Z');
  for (const bad of [
    jwt({ iat: 1 }),
    jwt({ exp: 0 }),
    jwt({ exp: 1.5 }),
    jwt({ exp: '1700000000' }),
    jwt({ exp: 1e15 }),
    'notavalidtoken',
    'header.payload',
    'a.b.c.d',
    'header.!!!invalid!!!.signature',
    `header.${Buffer.from('not json').toString('base64url')}.signature`,
    `header.${Buffer.from('null').toString('base64url')}.signature`,
    '',
  ]) {
    assert.equal(jwtExpiration(bad), undefined, bad);
  }
});

test('node-wide bucket: behind the per-VM ones, shared by every VM', { timeout: 30_000 }, async () => {
  const small = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: dir,
    keyring,
    logger: quietLogger,
    metrics,
    compatSourceAddress: true,
    clock: { now: () => new Date(), monotonicMs: () => nowMs },
    imdsLimits: { nodeRatePerSecond: 1, nodeBurst: 3 },
  });
  try {
    const p = small.address.port;
    const got = [];
    for (const from of ['127.0.0.1', '127.0.0.2', '127.0.0.1', '127.0.0.2'])
      got.push((await get(p, '/v1/identity', MD, from)).status);
    assert.deepEqual(got, [200, 200, 200, 429]);
    assert.match(
      await metrics.registry.metrics(),
      /vmseed_imds_rate_limited_total\{family="identity",scope="node"\} 1/,
    );
  } finally {
    await small.close();
  }
});

test(
  'a flood is logged once a minute per kind, counting the refusals held back; every 429 keeps its headers',
  { timeout: 60_000 },
  async () => {
    const logs: Array<Record<string, unknown>> = [];
    let t = 0;
    const small = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: pino(
        { level: 'warn' },
        { write: (line: string) => logs.push(JSON.parse(line) as Record<string, unknown>) },
      ),
      compatSourceAddress: true,
      clock: { now: () => new Date(), monotonicMs: () => t },
      imdsLimits: { ratePerSecond: 1, burst: 1 },
      limits: { ratePerSecond: 1_000_000, burst: 1_000_000 },
    });
    try {
      const p = small.address.port;
      const flood = async (n: number) => {
        const got: number[] = [];
        for (let i = 0; i < n; i++) {
          const r = await get(p, '/v1/identity', MD, '127.0.0.1');
          got.push(r.status);
          if (r.status !== 429) continue;
          assert.equal(r.headers['retry-after'], '1');
          assert.equal(r.headers['cache-control'], 'no-store');
          assert.equal(r.headers['x-content-type-options'], 'nosniff');
          assert.equal(r.headers['content-type'], 'text/plain; charset=utf-8');
          assert.equal(r.headers['content-length'], String(Buffer.byteLength(r.body)));
          assert.equal(r.body, 'rate limit exceeded\n');
        }
        return got;
      };
      assert.deepEqual(await flood(21), [200, ...Array<number>(20).fill(429)]);
      const hits = () => logs.filter((l) => l.kind === 'rate-vm');
      assert.equal(hits().length, 1);
      assert.equal(hits()[0].suppressedSinceLast, undefined);
      t += 59_000; // within the minute: still held back (and 59 tokens back)
      assert.deepEqual(await flood(1), [200]);
      t += 1_000;
      assert.deepEqual(await flood(3), [200, 429, 429]);
      assert.equal(hits().length, 2);
      assert.equal(hits()[1].suppressedSinceLast, 19);
      assert.equal(hits()[1].family, 'identity');
      assert.equal(hits()[1].scope, 'vm');
    } finally {
      await small.close();
    }
  },
);
