import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Client } from 'undici';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { metaDataBytes } from '../../src/cloudinit/seed-files.ts';
import { startDatasourceServer, parseListen, type DatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring, signToken } from '../../src/datasource/tokens.ts';
import { datasourceSeedUrl } from '../../src/datasource/url.ts';
import {
  MapDirectory,
  cloudInitReadSeeded,
  nocloudSeed,
  quietLogger,
  randomKey,
  rawRequest,
} from './datasource-fixtures.ts';

const b64 = (u: Uint8Array) => Buffer.from(u).toString('base64');

describe('cloud-init 22.4 read_seeded against the running datasource', () => {
  const dir = new MapDirectory();
  const keyring = new DatasourceKeyring([randomKey()]);
  let server: DatasourceServer;
  const seedA = nocloudSeed('a');
  const seedB = nocloudSeed('b', { vendorData: undefined, networkConfig: undefined });
  before(async () => {
    dir.add({ namespace: 'ns1', name: 'vm-a', uid: 'uid-a', seed: seedA });
    dir.add({ namespace: 'ns1', name: 'vm-b', uid: 'uid-b', seed: seedB });
    server = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: quietLogger,
    });
  });
  after(() => server.close());

  test('base with trailing slash (what seed-url prints): exactly the seed', async () => {
    const base = datasourceSeedUrl(server.baseUrl, keyring.sign('uid-a'));
    assert.ok(base.endsWith('/'));
    const r = await cloudInitReadSeeded(base);
    assert.equal(r.ok, true, r.error);
    assert.deepEqual(r.md, seedA.metaData);
    assert.equal(r.ud, b64(seedA.userData));
    assert.equal(r.vd, b64(seedA.vendorData!));
    const files = dir.fetches.filter((f) => f.name === 'vm-a').map((f) => f.file);
    assert.deepEqual(files, ['meta-data', 'user-data', 'vendor-data']);
  });

  test('base without trailing slash: 22.4 concatenates raw (/v1/<token>meta-data) and still gets the seed', async () => {
    const base = datasourceSeedUrl(server.baseUrl, keyring.sign('uid-a')).replace(/\/$/, '');
    const r = await cloudInitReadSeeded(base);
    assert.equal(r.ok, true, r.error);
    assert.deepEqual(r.md, seedA.metaData);
    assert.equal(r.ud, b64(seedA.userData));
    assert.equal(r.vd, b64(seedA.vendorData!));
  });

  test('base with %s (read_seeded substitutes the name)', async () => {
    const r = await cloudInitReadSeeded(`${server.baseUrl}/${keyring.sign('uid-a')}/%s`);
    assert.equal(r.ok, true, r.error);
    assert.deepEqual(r.md, seedA.metaData);
  });

  test('seed without vendor-data: an empty vendor-data by default, which cloud-init reads as none', async () => {
    const r = await cloudInitReadSeeded(datasourceSeedUrl(server.baseUrl, keyring.sign('uid-b')));
    assert.equal(r.ok, true, r.error);
    assert.deepEqual(r.md, seedB.metaData);
    assert.equal(r.ud, b64(seedB.userData));
    assert.equal(r.vd, '');
  });

  test('unknown token: cloud-init fails on meta-data/user-data (the datasource does not claim the guest)', async () => {
    const r = await cloudInitReadSeeded(`${server.baseUrl}/${signToken(randomKey(), 'uid-a')}/`);
    assert.equal(r.ok, false);
    assert.match(r.error!, /404/);
  });
});

describe('datasource HTTP behaviour', () => {
  const dir = new MapDirectory();
  const key1 = randomKey();
  const keyring = new DatasourceKeyring([key1]);
  const metrics = createMetrics({ version: 'test', processMetrics: false });
  let server: DatasourceServer;
  let port: number;
  const seedA = nocloudSeed('a');
  before(async () => {
    dir.add({ namespace: 'ns1', name: 'vm-a', uid: 'uid-a', seed: seedA });
    dir.add({ namespace: 'ns1', name: 'vm-b', uid: 'uid-b', seed: nocloudSeed('b', { networkConfig: undefined }) });
    dir.add({
      namespace: 'ns1',
      name: 'vm-cd',
      uid: 'uid-cd',
      seed: { ...nocloudSeed('cd'), datasource: 'configdrive' },
    });
    server = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      metrics,
      logger: quietLogger,
      limits: { ratePerSecond: 10_000, burst: 10_000 },
      // A file really missing from a seed: no empty network-config stand-in.
      serveEmptyNetworkConfig: false,
    });
    port = server.address.port;
  });
  after(() => server.close());

  test('all four files, with and without the slash after the token, exact bytes, no-store', async () => {
    const t = keyring.sign('uid-a');
    const want = {
      'meta-data': metaDataBytes(seedA),
      'user-data': seedA.userData,
      'vendor-data': seedA.vendorData!,
      'network-config': seedA.networkConfig!,
    };
    for (const [file, bytes] of Object.entries(want)) {
      for (const path of [`/v1/${t}/${file}`, `/v1/${t}${file}`]) {
        const r = await rawRequest(port, path);
        assert.equal(r.status, 200, path);
        assert.deepEqual(new Uint8Array(r.body), new Uint8Array(bytes), path);
        assert.equal(r.headers['cache-control'], 'no-store');
        assert.equal(r.headers['content-length'], String(bytes.byteLength));
      }
    }
  });

  test('404s are indistinguishable: malformed, unknown, other-key and missing-file answers are identical', async () => {
    const paths = [
      `/v1/not-a-token/user-data`,
      `/v1/${signToken(randomKey(), 'uid-a')}/user-data`, // right uid, wrong key
      `/v1/${keyring.sign('uid-nope')}/user-data`, // right key, unknown uid
      `/v1/${keyring.sign('uid-b')}/network-config`, // known VMI, file missing from its seed
      `/v1/${keyring.sign('uid-cd')}/user-data`, // ConfigDrive seed: not served as NoCloud
      `/v1/${keyring.sign('uid-a')}/`,
      `/v1/${keyring.sign('uid-a')}/passwd`,
      `/v1/user-data`, // compat mode is off
      `/metrics`,
      `/status`,
      `/`,
    ];
    const answers = await Promise.all(paths.map((p) => rawRequest(port, p)));
    const shape = (r: (typeof answers)[number]) => {
      const { date: _d, ...h } = r.headers;
      return { status: r.status, headers: h, body: r.body.toString('latin1') };
    };
    for (let i = 0; i < paths.length; i++) {
      assert.deepEqual(shape(answers[i]), shape(answers[0]), paths[i]);
    }
    assert.equal(answers[0].status, 404);
    assert.equal(answers[0].body.toString(), 'not found\n');
    assert.equal(answers[0].headers['cache-control'], 'no-store');
  });

  test('HEAD: headers of the GET, no body, no recorded fetch', async () => {
    const before = dir.fetches.length;
    const path = `/v1/${keyring.sign('uid-a')}/user-data`;
    const r = await rawRequest(port, path, { method: 'HEAD' });
    assert.equal(r.status, 200);
    assert.equal(r.headers['content-length'], String(seedA.userData.byteLength));
    assert.equal(r.headers['cache-control'], 'no-store');
    assert.equal(r.body.length, 0);
    assert.equal(dir.fetches.length, before);
    const miss = await rawRequest(port, `/v1/${keyring.sign('uid-b')}/network-config`, { method: 'HEAD' });
    assert.equal(miss.status, 404);
    assert.equal(miss.body.length, 0);
  });

  test('GET records the fetch with namespace, name, file and time', async () => {
    const t0 = Date.now();
    await rawRequest(port, `/v1/${keyring.sign('uid-b')}/user-data`);
    const last = dir.fetches.at(-1)!;
    assert.equal(last.namespace, 'ns1');
    assert.equal(last.name, 'vm-b');
    assert.equal(last.file, 'user-data');
    assert.ok(last.at.getTime() >= t0 - 5 && last.at.getTime() <= Date.now() + 5);
  });

  test('methods other than GET/HEAD: 405 with Allow; a request body: 400; too long: 414', async () => {
    const path = `/v1/${keyring.sign('uid-a')}/user-data`;
    for (const method of ['POST', 'PUT', 'DELETE', 'OPTIONS', 'PATCH']) {
      const r = await rawRequest(port, path, { method, headers: ['Content-Length: 0'] });
      assert.equal(r.status, 405, method);
      assert.equal(r.headers.allow, 'GET, HEAD');
      assert.equal(r.headers['cache-control'], 'no-store');
      assert.doesNotMatch(r.body.toString(), /secret-of/);
    }
    const withBody = await rawRequest(port, path, { headers: ['Content-Length: 5'], body: 'hello' });
    assert.equal(withBody.status, 400);
    assert.doesNotMatch(withBody.body.toString(), /secret-of/);
    const chunked = await rawRequest(port, path, {
      headers: ['Transfer-Encoding: chunked'],
      body: '5\r\nhello\r\n0\r\n\r\n',
    });
    assert.equal(chunked.status, 400);
    const long = await rawRequest(port, `${path}?${'x'.repeat(300)}`);
    assert.equal(long.status, 414);
    assert.equal(long.headers['cache-control'], 'no-store');
  });

  test('oversized headers and malformed HTTP get a plain 431/400, no-store, and the server keeps serving', async () => {
    const big = await rawRequest(port, '/v1/x', { headers: [`X-Big: ${'a'.repeat(20_000)}`] });
    assert.equal(big.status, 431);
    assert.equal(big.headers['cache-control'], 'no-store');
    const bad = await rawRequest(port, '/v1/x', { method: 'G\x00T' });
    assert.equal(bad.status, 400);
    const ok = await rawRequest(port, `/v1/${keyring.sign('uid-a')}/meta-data`);
    assert.equal(ok.status, 200);
  });

  test('metrics: requests by endpoint and status, durations by endpoint, bounded labels', async () => {
    await rawRequest(port, `/v1/${keyring.sign('uid-a')}/network-config`);
    await rawRequest(port, `/v1/${keyring.sign('uid-a')}/../../etc/passwd`);
    const text = await metrics.registry.metrics();
    assert.match(text, /vmseed_datasource_requests_total\{endpoint="network-config",status="200"\} [1-9]/);
    assert.match(text, /vmseed_datasource_requests_total\{endpoint="other",status="404"\} [1-9]/);
    assert.match(text, /vmseed_datasource_request_duration_seconds_count\{endpoint="user-data"\} [1-9]/);
    const endpoints = new Set(
      [...text.matchAll(/vmseed_datasource_requests_total\{endpoint="([^"]+)"/g)].map((m) => m[1]),
    );
    for (const e of endpoints)
      assert.ok(['meta-data', 'user-data', 'vendor-data', 'network-config', 'other'].includes(e), e);
  });

  test('a directory that throws gives 500 without a stack trace, and the server survives', async () => {
    const broken = new MapDirectory();
    broken.add({ namespace: 'n', name: 'x', uid: 'uid-x', seed: nocloudSeed('x') });
    broken.get = () => {
      throw new Error('boom at /srv/secret/path.ts:12');
    };
    const s = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: broken,
      keyring,
      logger: quietLogger,
    });
    try {
      const r = await rawRequest(s.address.port, `/v1/${keyring.sign('uid-x')}/user-data`);
      assert.equal(r.status, 500);
      assert.equal(r.body.toString(), 'internal error\n');
      assert.equal(r.headers['cache-control'], 'no-store');
      const again = await rawRequest(s.address.port, `/v1/${keyring.sign('uid-x')}/user-data`);
      assert.equal(again.status, 500);
    } finally {
      await s.close();
    }
  });
});

// A listener serving one VMI, `uid-a`, with these per-source limits; its
// buckets run on `monotonicMs`.
async function oneVmServer(limits: { ratePerSecond: number; burst: number }, monotonicMs: () => number) {
  const dir = new MapDirectory();
  dir.add({ namespace: 'n', name: 'a', uid: 'uid-a', seed: nocloudSeed('a') });
  const keyring = new DatasourceKeyring([randomKey()]);
  const server = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: dir,
    keyring,
    logger: quietLogger,
    limits,
    clock: { now: () => new Date(), monotonicMs },
  });
  return { server, keyring };
}

describe('rate limiting per source address', () => {
  test('token bucket: burst, then 429 with Retry-After, refills with time', async () => {
    let ms = 0;
    const { server, keyring } = await oneVmServer({ ratePerSecond: 2, burst: 3 }, () => ms);
    try {
      const path = `/v1/${keyring.sign('uid-a')}/user-data`;
      const statuses: number[] = [];
      for (let i = 0; i < 5; i++) statuses.push((await rawRequest(server.address.port, path)).status);
      assert.deepEqual(statuses, [200, 200, 200, 429, 429]);
      const limited = await rawRequest(server.address.port, path);
      assert.equal(limited.headers['retry-after'], '1');
      assert.equal(limited.headers['cache-control'], 'no-store');
      assert.doesNotMatch(limited.body.toString(), /secret-of/);
      // Wrong tokens cost tokens too: probing is rate limited as well.
      ms += 500; // one token back
      assert.equal((await rawRequest(server.address.port, '/v1/guess/user-data')).status, 404);
      assert.equal((await rawRequest(server.address.port, path)).status, 429);
      ms += 1500; // three back (capped at burst 3)
      const after = [];
      for (let i = 0; i < 4; i++) after.push((await rawRequest(server.address.port, path)).status);
      assert.deepEqual(after, [200, 200, 200, 429]);
    } finally {
      await server.close();
    }
  });
});

describe('rate limiting: the refused connection', () => {
  test('a keep-alive connection refused 429 is not read again for its Retry-After second', async () => {
    // The bucket's clock stands still: one token, then refusals only.
    const { server, keyring } = await oneVmServer({ ratePerSecond: 2, burst: 1 }, () => 0);
    const c = new Client(`http://127.0.0.1:${server.address.port}`, { pipelining: 1 });
    const ask = async () => {
      const r = await c.request({ path: `/v1/${keyring.sign('uid-a')}/meta-data`, method: 'GET' });
      await r.body.arrayBuffer();
      return { status: r.statusCode, at: performance.now() };
    };
    try {
      assert.equal((await ask()).status, 200);
      const refused = await ask();
      assert.equal(refused.status, 429);
      const next = await ask();
      assert.equal(next.status, 429);
      assert.ok(next.at - refused.at >= 500, `next answer ${(next.at - refused.at).toFixed(0)} ms after the 429`);
    } finally {
      await c.destroy();
      await server.close();
    }
  });
});

describe('key rotation', () => {
  test('old tokens work while the old key is listed, stop after it is removed; new key signs', async () => {
    const dir = new MapDirectory();
    const seed = nocloudSeed('a');
    dir.add({ namespace: 'n', name: 'a', uid: 'uid-a', seed });
    const oldKey = randomKey();
    const newKey = randomKey();
    const keyring = new DatasourceKeyring([oldKey]);
    const server = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: quietLogger,
    });
    try {
      const oldToken = keyring.sign('uid-a');
      const get = async (t: string) => (await rawRequest(server.address.port, `/v1/${t}/user-data`)).status;
      assert.equal(await get(oldToken), 200);
      keyring.replace([newKey, oldKey]); // step 1: add the new key, sign with it
      const newToken = keyring.sign('uid-a');
      assert.notEqual(newToken, oldToken);
      assert.equal(await get(newToken), 200);
      assert.equal(await get(oldToken), 200);
      const r = await cloudInitReadSeeded(datasourceSeedUrl(server.baseUrl, oldToken));
      assert.equal(r.ok, true, r.error);
      keyring.replace([newKey]); // step 2: remove the old key
      assert.equal(await get(oldToken), 404);
      assert.equal(await get(newToken), 200);
    } finally {
      await server.close();
    }
  });

  test('VMIs added and removed: index follows the directory, rebuilt only when the revision moves', async () => {
    const dir = new MapDirectory();
    const keyring = new DatasourceKeyring([randomKey()]);
    const server = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: quietLogger,
      limits: { ratePerSecond: 1000, burst: 1000 },
    });
    try {
      const get = async (uid: string) =>
        (await rawRequest(server.address.port, `/v1/${keyring.sign(uid)}/meta-data`)).status;
      assert.equal(await get('uid-a'), 404);
      dir.add({ namespace: 'n', name: 'a', uid: 'uid-a', seed: nocloudSeed('a') });
      assert.equal(await get('uid-a'), 200);
      const calls = dir.listCalls;
      for (let i = 0; i < 5; i++) await get('uid-unknown');
      assert.equal(dir.listCalls, calls, 'unknown tokens must not trigger a rebuild');
      dir.remove('uid-a');
      assert.equal(await get('uid-a'), 404);
    } finally {
      await server.close();
    }
  });
});

test('serveEmptyVendorData (default on) spares cloud-init 22.4 a 10 s retry loop; off, vendor-data is a 404', async () => {
  const dir = new MapDirectory();
  const seed = nocloudSeed('b', { vendorData: undefined });
  dir.add({ namespace: 'n', name: 'b', uid: 'uid-b', seed });
  const keyring = new DatasourceKeyring([randomKey()]);
  const s = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: dir,
    keyring,
    logger: quietLogger,
  });
  const strict = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: dir,
    keyring,
    logger: quietLogger,
    serveEmptyVendorData: false,
  });
  try {
    // retries=10: what DataSourceNoCloud passes (read_seeded's default).
    const r = await cloudInitReadSeeded(datasourceSeedUrl(s.baseUrl, keyring.sign('uid-b')), 10);
    assert.equal(r.ok, true, r.error);
    assert.equal(r.vd, '');
    assert.equal(r.ud, b64(seed.userData));
    // Counted, not timed (a loaded machine stretches any duration): each
    // file answered at the first request, so no retry loop ran.
    assert.deepEqual(dir.fetches.map((f) => f.file).sort(), ['meta-data', 'user-data', 'vendor-data']);
    const unknown = await rawRequest(s.address.port, `/v1/${keyring.sign('uid-x')}/vendor-data`);
    assert.equal(unknown.status, 404);
    const off = await rawRequest(strict.address.port, `/v1/${keyring.sign('uid-b')}/vendor-data`);
    assert.equal(off.status, 404);
  } finally {
    await s.close();
    await strict.close();
  }
});

describe('compat mode (token-less, by source address)', () => {
  test('off by default; on: answers the VMI reporting 127.0.0.1, and nothing when the address is ambiguous', async () => {
    const keyring = new DatasourceKeyring([randomKey()]);
    const dir = new MapDirectory();
    const seed = nocloudSeed('a');
    dir.add({ namespace: 'n', name: 'a', uid: 'uid-a', seed }, ['127.0.0.1']);
    const off = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: quietLogger,
    });
    const on = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: quietLogger,
      compatSourceAddress: true,
    });
    try {
      assert.equal((await rawRequest(off.address.port, '/v1/user-data')).status, 404);
      for (const p of ['/v1/user-data', '/v1user-data']) {
        const r = await rawRequest(on.address.port, p);
        assert.equal(r.status, 200, p);
        assert.deepEqual(new Uint8Array(r.body), seed.userData);
      }
      const ci = await cloudInitReadSeeded(`${on.baseUrl}/`);
      assert.equal(ci.ok, true, ci.error);
      assert.deepEqual(ci.md, seed.metaData);
      dir.add({ namespace: 'n', name: 'b', uid: 'uid-b', seed: nocloudSeed('b') }, ['127.0.0.1']);
      assert.equal((await rawRequest(on.address.port, '/v1/user-data')).status, 404);
    } finally {
      await off.close();
      await on.close();
    }
  });
});

test('parseListen', () => {
  assert.deepEqual(parseListen('127.0.0.1:8081'), { host: '127.0.0.1', port: 8081 });
  assert.deepEqual(parseListen('[::1]:80'), { host: '::1', port: 80 });
  assert.deepEqual(parseListen(':9000'), { host: '0.0.0.0', port: 9000 });
  assert.throws(() => parseListen('localhost'), RangeError);
  assert.throws(() => parseListen('1.2.3.4:70000'), RangeError);
});
