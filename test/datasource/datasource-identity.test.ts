// Which VMI a seed or IMDS token opens, now that requests are checked
// against the index's stored tokens instead of recomputing HMACs: the index
// must follow the keys and the directory exactly, never answer one VMI's
// token for another, and never grow with tokens that open nothing. A
// serial token (random, in the VMI's own spec) opens the VMI whose serial
// carries it, from its launcher address; a copy of it in a neighbour's
// serial denies nobody.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SeedIdentity, TokenIndex } from '../../src/datasource/identity.ts';
import { DatasourceKeyring, randomToken, signToken } from '../../src/datasource/tokens.ts';
import type { SeedDirectoryEntry } from '../../src/datasource/types.ts';
import { MapDirectory, nocloudSeed, randomKey } from './datasource-fixtures.ts';

const route = (token: string) => ({ kind: 'token' as const, token, file: 'meta-data' as const });

function vmi(uid: string, serialToken?: string): SeedDirectoryEntry {
  return { namespace: 'n', name: uid, uid, seed: nocloudSeed(uid), ...(serialToken ? { serialToken } : {}) };
}

// A MapDirectory that knows launcher pods: address -> VMI UID.
class LauncherDirectory extends MapDirectory {
  readonly launchers = new Map<string, string>();
  launcherAt(address: string): string | undefined {
    return this.launchers.get(address);
  }
}

test("a token opens its own VMI only: never another's, never one signed by a key not loaded", () => {
  const key = randomKey();
  const serialB = randomToken();
  const dir = new MapDirectory();
  dir.add(vmi('uid-a'));
  dir.add(vmi('uid-b', serialB));
  const id = new SeedIdentity(dir, new DatasourceKeyring([key]), false);
  assert.equal(id.lookup(route(signToken(key, 'uid-a')), '127.0.0.1')?.uid, 'uid-a');
  assert.equal(id.lookup(route(signToken(key, 'uid-b')), '127.0.0.1')?.uid, 'uid-b');
  assert.equal(id.lookup(route(serialB), '127.0.0.1')?.uid, 'uid-b');
  assert.equal(id.lookup(route(randomToken()), '127.0.0.1'), undefined, 'a random token no VMI carries');
  assert.equal(id.lookup(route(signToken(randomKey(), 'uid-a')), '127.0.0.1'), undefined);
  assert.equal(id.lookup(route(signToken(key, 'uid-unknown')), '127.0.0.1'), undefined);
  // Not token-shaped (a route never carries one, but the check must not throw).
  for (const t of ['', 'short', `${signToken(key, 'uid-a')}x`, 'é'.repeat(43)])
    assert.equal(id.lookup(route(t), '127.0.0.1'), undefined, t);
  // One character off: the hash misses, and so would the constant-time compare.
  for (const a of [signToken(key, 'uid-a'), serialB]) {
    const off = `${a.slice(0, 42)}${a[42] === 'A' ? 'B' : 'A'}`;
    assert.equal(id.lookup(route(off), '127.0.0.1'), undefined);
  }
});

test("a serial token is no key's: the keys' change leaves it alone, and a removed key's UID token stops at once", () => {
  const oldKey = randomKey();
  const newKey = randomKey();
  const serial = randomToken();
  const dir = new MapDirectory();
  dir.add(vmi('uid-a', serial));
  const keyring = new DatasourceKeyring([newKey, oldKey]);
  const id = new SeedIdentity(dir, keyring, false);
  const revision = dir.revision;
  assert.equal(id.lookup(route(signToken(oldKey, 'uid-a')), '')?.uid, 'uid-a');
  assert.equal(id.lookup(route(signToken(newKey, 'uid-a')), '')?.uid, 'uid-a');
  assert.equal(id.lookup(route(serial), '')?.uid, 'uid-a');
  keyring.replace([newKey]);
  assert.equal(dir.revision, revision);
  assert.equal(id.lookup(route(signToken(oldKey, 'uid-a')), ''), undefined);
  assert.equal(id.lookup(route(signToken(newKey, 'uid-a')), '')?.uid, 'uid-a');
  assert.equal(id.lookup(route(serial), '')?.uid, 'uid-a');
  // No key at all: the serial still opens its VMI.
  const empty = new SeedIdentity(dir, DatasourceKeyring.empty(), false);
  assert.equal(empty.lookup(route(serial), '')?.uid, 'uid-a');
});

test('a directory that changed before its revision moved is still the truth: deleted VMI, new serial, other entry', () => {
  const key = randomKey();
  const [s1, s2] = [randomToken(), randomToken()];
  const dir = new MapDirectory();
  dir.add(vmi('uid-a', s1));
  dir.add(vmi('uid-b'));
  const id = new SeedIdentity(dir, new DatasourceKeyring([key]), false);
  assert.equal(id.lookup(route(s1), '')?.uid, 'uid-a');
  assert.equal(id.lookup(route(signToken(key, 'uid-b')), '')?.uid, 'uid-b');
  // The index still holds these tokens; the directory no longer agrees.
  dir.entries.set('uid-a', vmi('uid-a', s2));
  assert.equal(id.lookup(route(s1), ''), undefined, 'old serial');
  assert.equal(id.lookup(route(signToken(key, 'uid-a')), '')?.uid, 'uid-a', 'the UID form still holds');
  dir.entries.set('uid-a', vmi('uid-other', s1));
  assert.equal(id.lookup(route(signToken(key, 'uid-a')), ''), undefined, 'entry of another UID');
  assert.equal(id.lookup(route(s1), ''), undefined, 'entry of another UID');
  dir.entries.delete('uid-b');
  assert.equal(id.lookup(route(signToken(key, 'uid-b')), ''), undefined, 'deleted');
});

test("with launcher pods known, a serial token opens its VMI from that VMI's launcher address only; a neighbour's copy denies nobody", () => {
  const key = randomKey();
  const token = randomToken();
  const dir = new LauncherDirectory();
  dir.add(vmi('uid-victim', token));
  dir.launchers.set('10.0.0.1', 'uid-victim');
  const id = new SeedIdentity(dir, new DatasourceKeyring([key]), false);
  assert.equal(id.lookup(route(token), '10.0.0.1')?.uid, 'uid-victim');
  assert.equal(id.lookup(route(token), '10.0.0.9'), undefined, 'from an address that is no launcher');
  // A neighbour VMI of the node carries a copy of the victim's serial.
  dir.add(vmi('uid-thief', token));
  dir.launchers.set('10.0.0.2', 'uid-thief');
  assert.equal(id.lookup(route(token), '10.0.0.1')?.uid, 'uid-victim', 'the victim is still served');
  assert.equal(id.lookup(route(token), '10.0.0.2')?.uid, 'uid-thief', 'the thief gets its own VMI, never the victim');
  assert.equal(id.lookup(route(token), '10.0.0.9'), undefined);
  // A launcher address of a VMI that does not carry the token: nothing.
  dir.add(vmi('uid-other', randomToken()));
  dir.launchers.set('10.0.0.3', 'uid-other');
  assert.equal(id.lookup(route(token), '10.0.0.3'), undefined);
  // The UID token, too, only from the launcher.
  assert.equal(id.lookup(route(signToken(key, 'uid-victim')), '10.0.0.1')?.uid, 'uid-victim');
  assert.equal(id.lookup(route(signToken(key, 'uid-victim')), '10.0.0.2'), undefined);
});

test('without launcher knowledge (local mode, --platform libvirt), one token in two serials opens neither', () => {
  const key = randomKey();
  const token = randomToken();
  const dir = new MapDirectory();
  dir.add(vmi('uid-a', token));
  dir.add(vmi('uid-b', token));
  const id = new SeedIdentity(dir, new DatasourceKeyring([key]), false);
  assert.equal(id.lookup(route(token), ''), undefined);
  assert.equal(id.lookup(route(signToken(key, 'uid-a')), '')?.uid, 'uid-a');
  assert.equal(id.lookup(route(signToken(key, 'uid-b')), '')?.uid, 'uid-b');
  dir.remove('uid-b');
  assert.equal(id.lookup(route(token), '')?.uid, 'uid-a');
});

test('a VMI re-created with a fresh serial is not opened by the old serial', () => {
  const [oldToken, newToken] = [randomToken(), randomToken()];
  const dir = new LauncherDirectory();
  dir.add({ ...vmi('uid-1', oldToken), name: 'web' });
  dir.launchers.set('10.0.0.1', 'uid-1');
  const id = new SeedIdentity(dir, DatasourceKeyring.empty(), false);
  assert.equal(id.lookup(route(oldToken), '10.0.0.1')?.uid, 'uid-1');
  dir.remove('uid-1');
  dir.launchers.delete('10.0.0.1');
  dir.add({ ...vmi('uid-2', newToken), name: 'web' });
  dir.launchers.set('10.0.0.1', 'uid-2');
  assert.equal(id.lookup(route(oldToken), '10.0.0.1'), undefined);
  assert.equal(id.lookup(route(newToken), '10.0.0.1')?.uid, 'uid-2');
});

test('the index holds keys x messages plus the serials of the directory, and a spray of unknown tokens adds nothing', () => {
  const keys = [randomKey(), randomKey()];
  const serials = new Map<number, string>();
  const dir = new MapDirectory();
  for (let i = 0; i < 50; i++) {
    if (i % 2) serials.set(i, randomToken());
    dir.add(vmi(`uid-${i}`, serials.get(i)));
  }
  const index = new TokenIndex(dir, new DatasourceKeyring(keys));
  assert.deepEqual(
    index.verified(serials.get(1)!)?.claims.map((c) => c.uid),
    ['uid-1'],
  );
  const size = index.size;
  assert.equal(size, 2 * 50 + 25);
  const spray = randomKey();
  for (let i = 0; i < 2000; i++) assert.equal(index.verified(signToken(spray, `uid-${i}`)), undefined);
  for (let i = 0; i < 200; i++) assert.equal(index.verified(randomToken()), undefined);
  assert.equal(index.size, size);
  dir.remove('uid-1');
  assert.equal(index.verified(serials.get(1)!), undefined);
  assert.equal(index.size, size - 3);
  // A report index holds no serial token.
  const reports = new TokenIndex(dir, new DatasourceKeyring(keys), { messagesOf: (u) => [`r:${u}`], serials: false });
  assert.equal(reports.verified(serials.get(3)!), undefined);
  assert.equal(reports.size, 2 * 49);
});
