// --datasource-imds-session on the real listener: `PUT /v1/session` issues a
// short-lived token bound to the VMI and the source address that asked, and
// /v1/identity and /v1/token check it (required: always; optional: when
// sent). Each launcher pod is a 127.0.0.x source address; time is the
// listener's injected monotonic clock, so expiry is exact.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Agent, request } from 'node:http';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { SessionStore, SESSION_DEFAULTS } from '../../src/datasource/imds/sessions.ts';
import type { SessionMode } from '../../src/datasource/imds/session-endpoint.ts';
import { MapDirectory, nocloudSeed, quietLogger, randomKey } from './datasource-fixtures.ts';
import { entry, facts, get, type Answer } from './imds-support.ts';

// A launcher pod may hold several addresses (status.podIPs): `a` has two.
const A = '127.0.0.21';
const A_SECOND = '127.0.0.31';
const B = '127.0.0.22';
const NOT_A_LAUNCHER = '127.0.0.50';
const MD = { Metadata: 'true' };
const TTL = 'X-Vmseed-Session-Ttl-Seconds';
const SESSION = 'X-Vmseed-Session';

// The node's launcher pods known, as with --platform kubevirt: every answer
// by identity needs the source to be the VMI's launcher.
class LauncherDirectory extends MapDirectory {
  launcherAt(address: string): string | undefined {
    const uids = this.addresses.get(address) ?? [];
    return uids.length === 1 ? uids[0] : undefined;
  }
}

let monotonic = 1_000_000;
const clock = { now: () => new Date(), monotonicMs: () => monotonic };
const keyring = new DatasourceKeyring([randomKey()]);
let dir: LauncherDirectory;
const servers: DatasourceServer[] = [];
const port: Partial<Record<SessionMode | 'capped', number>> = {};

function directory(): LauncherDirectory {
  const d = new LauncherDirectory();
  const seed = (n: string) => nocloudSeed(n, { delivery: 'http' });
  d.add(entry('a', seed('a'), facts({ serviceAccountName: 'sa-a' })), [A, A_SECOND]);
  d.add(entry('b', seed('b'), facts({ serviceAccountName: 'sa-b' })), [B]);
  return d;
}

async function start(mode: SessionMode, d: LauncherDirectory, perVmi?: number): Promise<number> {
  const s = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: d,
    keyring,
    logger: quietLogger,
    compatSourceAddress: true,
    clock,
    imdsLimits: { ratePerSecond: 1e6, burst: 1e6, nodeRatePerSecond: 1e6, nodeBurst: 1e6 },
    limits: { ratePerSecond: 1e6, burst: 1e6 },
    ...(mode === 'off' ? {} : { imdsSessions: { mode, ...(perVmi ? { limits: { perVmi } } : {}) } }),
  });
  servers.push(s);
  return s.address.port;
}

before(async () => {
  dir = directory();
  port.required = await start('required', dir);
  port.optional = await start('optional', dir);
  port.off = await start('off', dir);
  port.capped = await start('required', dir, 3);
});
after(async () => {
  for (const s of servers) await s.close();
});

const put = (
  p: number,
  from: string,
  headers: Record<string, string | string[]> = { [TTL]: '60' },
  path = '/v1/session',
) => get(p, path, headers, from, 'PUT');

async function session(p: number, from: string, ttl = '60'): Promise<string> {
  const r = await put(p, from, { [TTL]: ttl });
  assert.equal(r.status, 200, r.body);
  return r.body;
}

const identity = (p: number, from: string, token?: string, path = '/v1/identity') =>
  get(p, path, token === undefined ? MD : { ...MD, [SESSION]: token }, from);

const IDENTITY_A = '{"namespace":"tenant","serviceAccountName":"sa-a","vmName":"a"}\n';

function unauthorized(r: Answer): void {
  assert.equal(r.status, 401, r.body);
  assert.equal(JSON.parse(r.body).error, 'invalid_session');
  assert.ok(!r.body.includes('sa-a'), 'nothing of the VMI');
}

test('PUT /v1/session issues a token as text, its TTL echoed; the token opens /v1/identity from the same source', async () => {
  const r = await put(port.required!, A, { [TTL]: '21600' });
  assert.equal(r.status, 200, r.body);
  assert.match(String(r.headers['content-type']), /^text\/plain/);
  assert.equal(r.headers['x-vmseed-session-ttl-seconds'], '21600');
  assert.equal(r.headers['cache-control'], 'no-store');
  assert.match(r.body, /^[A-Za-z0-9_-]{43}$/, '32 random bytes, base64url, no newline');
  const id = await identity(port.required!, A, r.body);
  assert.equal(id.status, 200);
  assert.equal(id.body, IDENTITY_A);
  // Another PUT gives another token; both stay good.
  const again = await session(port.required!, A);
  assert.notEqual(again, r.body);
  assert.equal((await identity(port.required!, A, r.body)).status, 200);
  assert.equal((await identity(port.required!, A, again)).status, 200);
});

test('a token replayed from another address is 401: another address of the same VMI, or another VMI', async () => {
  const token = await session(port.required!, A);
  unauthorized(await identity(port.required!, A_SECOND, token));
  unauthorized(await identity(port.required!, B, token));
  // An address that is no launcher gets the identity miss, as without sessions.
  assert.equal((await identity(port.required!, NOT_A_LAUNCHER, token)).status, 404);
  // The token is still good where it was issued.
  assert.equal((await identity(port.required!, A, token)).status, 200);
});

test('a token is refused once its TTL has passed, not before', async () => {
  const token = await session(port.required!, A, '5');
  monotonic += 4_999;
  assert.equal((await identity(port.required!, A, token)).status, 200);
  monotonic += 1;
  unauthorized(await identity(port.required!, A, token));
  // A fresh PUT is the way on.
  assert.equal((await identity(port.required!, A, await session(port.required!, A))).status, 200);
});

test('required: /v1/identity and /v1/token without a session, or with a bad one, are 401; NoCloud and OpenStack need none', async () => {
  unauthorized(await identity(port.required!, A));
  unauthorized(await get(port.required!, '/v1/token', MD, A));
  unauthorized(await identity(port.required!, A, 'A'.repeat(43)));
  unauthorized(await identity(port.required!, A, 'not a token'));
  const token = await session(port.required!, A);
  // Node joins a repeated header: no token is two.
  unauthorized(await get(port.required!, '/v1/identity', { ...MD, [SESSION]: [token, token] }, A));
  // The guards come first: no Metadata header is still IMDS's 400.
  assert.equal((await get(port.required!, '/v1/identity', { [SESSION]: token }, A)).status, 400);
  // /v1/token with a session: past the session check (no serviceAccount volume: IMDS's 500).
  assert.equal((await get(port.required!, '/v1/token', { ...MD, [SESSION]: token }, A)).status, 500);
  // cloud-init's paths: no session, no header.
  assert.equal((await get(port.required!, '/v1/meta-data', {}, A)).status, 200);
  assert.equal((await get(port.required!, '/openstack/latest/meta_data.json', {}, A)).status, 200);
});

test('optional: served without a session as before; a session sent must be valid', async () => {
  const plain = await identity(port.optional!, A);
  assert.equal(plain.status, 200);
  assert.equal(plain.body, IDENTITY_A);
  unauthorized(await identity(port.optional!, A, 'A'.repeat(43)));
  const token = await session(port.optional!, A);
  assert.equal((await identity(port.optional!, A, token)).status, 200);
  unauthorized(await identity(port.optional!, B, token));
  // Sessions are the listener's own: one issued by another listener is unknown here.
  unauthorized(await identity(port.optional!, A, await session(port.required!, A)));
});

test('a PUT without one valid TTL header is 400', async () => {
  for (const ttl of [undefined, '', '0', '21601', '99999', '-1', '1.5', '5s', '0x10', '1e3', '007', ['5', '5']]) {
    const r = await put(port.required!, A, ttl === undefined ? {} : { [TTL]: ttl });
    assert.equal(r.status, 400, `TTL ${JSON.stringify(ttl)}: ${r.body}`);
    assert.equal(JSON.parse(r.body).error, 'invalid_ttl');
  }
  assert.equal((await put(port.required!, A, { [TTL]: '1' })).status, 200);
  assert.equal((await put(port.required!, A, { [TTL]: '21600' })).status, 200);
});

test('the PUT is answered to a launcher only (404 elsewhere), as PUT only, without Metadata: true', async () => {
  const miss = await put(port.required!, NOT_A_LAUNCHER);
  assert.equal(miss.status, 404);
  assert.equal(miss.body, 'not found\n');
  const wrong = await get(port.required!, '/v1/session', { [TTL]: '60' }, A);
  assert.equal(wrong.status, 405);
  assert.equal(wrong.headers.allow, 'PUT');
  assert.equal((await get(port.required!, '/v1/session', { [TTL]: '60' }, A, 'POST')).status, 405);
  assert.equal((await put(port.required!, A, { [TTL]: '60', Metadata: 'true' })).status, 200);
});

test('X-Forwarded-For or Forwarded on the PUT is refused, as on every path', async () => {
  for (const h of ['X-Forwarded-For', 'Forwarded']) {
    const r = await put(port.required!, A, { [TTL]: '60', [h]: '192.0.2.7' });
    assert.equal(r.status, 400);
    assert.match(r.body, /^forwarded requests are refused/);
  }
});

test('a VMI holds at most perVmi sessions: a new one drops its oldest; other VMIs keep theirs', async () => {
  const p = port.capped!;
  const b = await session(p, B);
  const tokens = [];
  for (let i = 0; i < 4; i++) tokens.push(await session(p, A));
  unauthorized(await identity(p, A, tokens[0]));
  for (const t of tokens.slice(1)) assert.equal((await identity(p, A, t)).status, 200);
  assert.equal((await get(p, '/v1/identity', { ...MD, [SESSION]: b }, B)).status, 200);
});

test('the PUT must open its connection: behind another request on a kept-alive connection it is 400', async () => {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  const on = (method: string, path: string, headers: Record<string, string>) =>
    new Promise<Answer & { local: number }>((resolve, reject) => {
      const req = request(
        { host: '127.0.0.1', port: port.required!, path, method, headers, localAddress: A, agent },
        (res) => {
          const local = res.socket.localPort ?? 0;
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body, local }));
        },
      );
      req.on('error', reject);
      req.end();
    });
  try {
    const first = await on('PUT', '/v1/session', { [TTL]: '60' });
    assert.equal(first.status, 200);
    const id = await on('GET', '/v1/identity', { ...MD, [SESSION]: first.body });
    assert.equal(id.status, 200);
    const second = await on('PUT', '/v1/session', { [TTL]: '60' });
    assert.equal(second.local, first.local, 'the same connection');
    assert.equal(second.status, 400);
    assert.equal(JSON.parse(second.body).error, 'session_not_first');
    assert.equal(second.headers.connection, 'close');
  } finally {
    agent.destroy();
  }
});

test('sessions off (the default): no session path, and a session header changes nothing', async () => {
  // The NoCloud screen's answer to any PUT, as before the option.
  const r = await put(port.off!, A);
  assert.equal(r.status, 405);
  assert.doesNotMatch(r.body, /^[A-Za-z0-9_-]{43}$/);
  assert.equal((await identity(port.off!, A, 'A'.repeat(43))).status, 200);
});

test('the token path form: PUT <prefix>/<token>/session, checked on <prefix>/<token>/identity', async () => {
  const uidToken = keyring.sign('uid-a');
  const r = await put(port.required!, A, { [TTL]: '60' }, `/v1/${uidToken}/session`);
  assert.equal(r.status, 200, r.body);
  assert.equal((await identity(port.required!, A, r.body, `/v1/${uidToken}/identity`)).status, 200);
  unauthorized(await identity(port.required!, A, undefined, `/v1/${uidToken}/identity`));
  // And it is the same VMI's session by address.
  assert.equal((await identity(port.required!, A, r.body)).status, 200);
  // From another VMI's launcher the token path opens nothing.
  assert.equal((await put(port.required!, B, { [TTL]: '60' }, `/v1/${uidToken}/session`)).status, 404);
});

test('the store: the node budget is checked before work; expired sessions and a gone VMI free their memory', () => {
  let now = 0;
  let revision = 1;
  const held = new Set(['u1', 'u2']);
  const store = new SessionStore({
    limits: { perNode: 2 },
    now: () => now,
    held: (uid) => held.has(uid),
    revision: () => revision,
  });
  assert.equal(SESSION_DEFAULTS.perVmi, 16);
  const t1 = store.issue('u1', A, 10)!;
  const t2 = store.issue('u2', B, 100)!;
  assert.equal(store.issue('u1', A, 10), undefined, 'the node budget is spent');
  assert.equal(store.verify(t1, 'u1', A), true);
  assert.equal(store.verify(t1, 'u2', A), 'other-vmi');
  assert.equal(store.verify(t1, 'u1', B), 'other-source');
  now = 9_999;
  assert.equal(store.verify(t1, 'u1', A), true);
  now = 10_000;
  // Refused; swept already or at the next sweep.
  assert.ok(['expired', 'unknown'].includes(store.verify(t1, 'u1', A) as string));
  assert.ok(store.issue('u1', A, 10), 'the expired one was swept for it');
  assert.equal(store.size, 2);
  assert.equal(store.verify(t1, 'u1', A), 'unknown');
  held.delete('u2');
  revision++;
  assert.equal(store.verify(t2, 'u2', B), 'unknown', 'a VMI that left the directory: its sessions are gone');
  assert.equal(store.size, 1);
  now = 30_000;
  store.verify('x', 'u1', A);
  assert.equal(store.size, 0);
});
