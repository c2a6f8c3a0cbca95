// The datasource challenge end to end on loopback: the agent's datasource
// answers it (rate-limited like every path, nothing about any VMI in it),
// and the sidecar's check tells it from another service on the port the
// DNAT points at, from nothing listening, and from keys it cannot read.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startDatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { answerMatches, CHALLENGE_PREFIX, newNonce } from '../../src/redirect/challenge.ts';
import { httpGet, targetChecker } from '../../src/redirect/target-check.ts';
import { MapDirectory, nocloudSeed, quietLogger, randomKey } from '../datasource/datasource-fixtures.ts';

async function datasource(keys: Uint8Array[], limits = {}) {
  const directory = new MapDirectory();
  directory.add({ namespace: 'ns', name: 'vm', uid: 'uid-vm', seed: nocloudSeed('vm') });
  return startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory,
    keyring: new DatasourceKeyring(keys),
    logger: quietLogger,
    limits,
  });
}

test('the datasource answers a challenge with one HMAC line per key; malformed nonces are 404; rate-limited', async (t) => {
  const [signing, old] = [randomKey(), randomKey()];
  const ds = await datasource([signing, old], { ratePerSecond: 0.001, burst: 6 });
  t.after(() => ds.close());
  const base = `http://127.0.0.1:${ds.address.port}`;
  const nonce = newNonce();
  const a = await httpGet(`${base}${CHALLENGE_PREFIX}${nonce}`, 2000);
  assert.equal(a.status, 200);
  assert.equal(a.body.trim().split('\n').length, 2);
  assert.ok(answerMatches([signing], nonce, a.body));
  assert.ok(answerMatches([old], nonce, a.body), 'a sidecar that still has only the old key matches too');
  assert.ok(!answerMatches([randomKey()], nonce, a.body));
  assert.ok(!answerMatches([signing], newNonce(), a.body), 'an answer is good for its nonce only');
  assert.doesNotMatch(a.body, /uid-vm|host-vm|instance/);
  for (const bad of ['', 'XYZ', `${nonce}0`, `${nonce}/x`, nonce.toUpperCase()])
    assert.equal((await httpGet(`${base}${CHALLENGE_PREFIX}${bad}`, 2000)).status, 404, bad);
  assert.equal((await httpGet(`${base}${CHALLENGE_PREFIX}${newNonce()}`, 2000)).status, 429);
});

test("the sidecar's check: the datasource passes; another service, nothing listening, unreadable keys fail with their reason", async (t) => {
  const key = randomKey();
  const ds = await datasource([key]);
  t.after(() => ds.close());
  const standIn = createServer((req, res) => res.end('ok\n'));
  await new Promise<void>((r) => standIn.listen(0, '127.0.0.1', r));
  t.after(() => standIn.close());
  const check = (port: number, keys = async () => [key]) => targetChecker({ to: { host: '127.0.0.1', port }, keys })();

  assert.deepEqual(await check(ds.address.port), { ok: true });
  const wrong = await check((standIn.address() as AddressInfo).port);
  assert.equal(wrong.ok, false);
  assert.equal(!wrong.ok && wrong.reason, 'wrong-target');
  assert.match(!wrong.ok ? wrong.message : '', /is not this node's datasource \(HTTP 200/);
  const otherKey = await check(ds.address.port, async () => [randomKey()]);
  assert.equal(!otherKey.ok && otherKey.reason, 'wrong-target', "another node's datasource (other keys) is not ours");
  const closed = await check(1);
  assert.equal(!closed.ok && closed.reason, 'target-unreachable');
  const unreadable = await check(ds.address.port, () => Promise.reject(new Error('ENOENT')));
  assert.equal(!unreadable.ok && unreadable.reason, 'target-unverified');
});
