// Which VMI a seed or IMDS token opens, now that requests are checked
// against the index's stored tokens instead of recomputing HMACs: the index
// must follow the keys and the directory exactly, never answer one VMI's
// token for another, and never grow with tokens that verify nothing.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SeedIdentity, TokenIndex } from '../../src/datasource/identity.ts';
import { DatasourceKeyring, signToken } from '../../src/datasource/tokens.ts';
import { MapDirectory, nocloudSeed, randomKey } from './datasource-fixtures.ts';

const route = (token: string) => ({ kind: 'token' as const, token, file: 'meta-data' as const });

function vmi(uid: string, binding?: string) {
  return { namespace: 'n', name: uid, uid, seed: nocloudSeed(uid), ...(binding ? { binding } : {}) };
}

test("a token opens its own VMI only: never another's, never one signed by a key not loaded", () => {
  const key = randomKey();
  const dir = new MapDirectory();
  dir.add(vmi('uid-a'));
  dir.add(vmi('uid-b', 'binding-b'));
  const id = new SeedIdentity(dir, new DatasourceKeyring([key]), false);
  assert.equal(id.lookup(route(signToken(key, 'uid-a')), '127.0.0.1')?.uid, 'uid-a');
  assert.equal(id.lookup(route(signToken(key, 'uid-b')), '127.0.0.1')?.uid, 'uid-b');
  assert.equal(id.lookup(route(signToken(key, 'binding-b')), '127.0.0.1')?.uid, 'uid-b');
  assert.equal(id.lookup(route(signToken(randomKey(), 'uid-a')), '127.0.0.1'), undefined);
  assert.equal(id.lookup(route(signToken(key, 'uid-unknown')), '127.0.0.1'), undefined);
  // Not token-shaped (a route never carries one, but the check must not throw).
  for (const t of ['', 'short', `${signToken(key, 'uid-a')}x`, 'é'.repeat(43)])
    assert.equal(id.lookup(route(t), '127.0.0.1'), undefined, t);
  // One character off: the hash misses, and so would the constant-time compare.
  const a = signToken(key, 'uid-a');
  const off = `${a.slice(0, 42)}${a[42] === 'A' ? 'B' : 'A'}`;
  assert.equal(id.lookup(route(off), '127.0.0.1'), undefined);
});

test('a removed key stops opening anything at once, with no directory change', () => {
  const oldKey = randomKey();
  const newKey = randomKey();
  const dir = new MapDirectory();
  dir.add(vmi('uid-a', 'binding-a'));
  const keyring = new DatasourceKeyring([newKey, oldKey]);
  const id = new SeedIdentity(dir, keyring, false);
  const revision = dir.revision;
  for (const m of ['uid-a', 'binding-a']) {
    assert.equal(id.lookup(route(signToken(oldKey, m)), '')?.uid, 'uid-a');
    assert.equal(id.lookup(route(signToken(newKey, m)), '')?.uid, 'uid-a');
  }
  keyring.replace([newKey]);
  assert.equal(dir.revision, revision);
  for (const m of ['uid-a', 'binding-a']) {
    assert.equal(id.lookup(route(signToken(oldKey, m)), ''), undefined, m);
    assert.equal(id.lookup(route(signToken(newKey, m)), '')?.uid, 'uid-a');
  }
});

test('a directory that changed before its revision moved is still the truth: deleted VMI, new binding, other entry', () => {
  const key = randomKey();
  const dir = new MapDirectory();
  dir.add(vmi('uid-a', 'binding-1'));
  dir.add(vmi('uid-b'));
  const id = new SeedIdentity(dir, new DatasourceKeyring([key]), false);
  assert.equal(id.lookup(route(signToken(key, 'binding-1')), '')?.uid, 'uid-a');
  assert.equal(id.lookup(route(signToken(key, 'uid-b')), '')?.uid, 'uid-b');
  // The index still holds these tokens; the directory no longer agrees.
  dir.entries.set('uid-a', vmi('uid-a', 'binding-2'));
  assert.equal(id.lookup(route(signToken(key, 'binding-1')), ''), undefined, 'old binding');
  assert.equal(id.lookup(route(signToken(key, 'uid-a')), '')?.uid, 'uid-a', 'the UID form still holds');
  dir.entries.set('uid-a', vmi('uid-other'));
  assert.equal(id.lookup(route(signToken(key, 'uid-a')), ''), undefined, 'entry of another UID');
  dir.entries.delete('uid-b');
  assert.equal(id.lookup(route(signToken(key, 'uid-b')), ''), undefined, 'deleted');
});

test('one token for two VMIs (a copied binding) opens neither', () => {
  const key = randomKey();
  const dir = new MapDirectory();
  dir.add(vmi('uid-a', 'same'));
  dir.add(vmi('uid-b', 'same'));
  const id = new SeedIdentity(dir, new DatasourceKeyring([key]), false);
  assert.equal(id.lookup(route(signToken(key, 'same')), ''), undefined);
  assert.equal(id.lookup(route(signToken(key, 'uid-a')), '')?.uid, 'uid-a');
  assert.equal(id.lookup(route(signToken(key, 'uid-b')), '')?.uid, 'uid-b');
});

test('the index holds keys x messages of the directory, and a spray of unknown tokens adds nothing', () => {
  const keys = [randomKey(), randomKey()];
  const dir = new MapDirectory();
  for (let i = 0; i < 50; i++) dir.add(vmi(`uid-${i}`, i % 2 ? `binding-${i}` : undefined));
  const index = new TokenIndex(dir, new DatasourceKeyring(keys));
  assert.equal(index.verified(signToken(keys[1], 'binding-1'))?.uid, 'uid-1');
  const size = index.size;
  assert.equal(size, 2 * (50 + 25));
  const spray = randomKey();
  for (let i = 0; i < 2000; i++) assert.equal(index.verified(signToken(spray, `uid-${i}`))?.uid, undefined);
  assert.equal(index.size, size);
  dir.remove('uid-0');
  assert.equal(index.verified(signToken(keys[0], 'uid-0'))?.uid, undefined);
  assert.equal(index.size, size - 2);
});
