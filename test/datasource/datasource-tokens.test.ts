import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { VmseedError } from '../../src/errors.ts';
import {
  DatasourceKeyring,
  TOKEN_LENGTH,
  fileKeySource,
  parseKeyFile,
  signToken,
} from '../../src/datasource/tokens.ts';
import { keyLine, randomKey } from './datasource-fixtures.ts';

function code(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    return e instanceof VmseedError ? e.code : `not a VmseedError: ${String(e)}`;
  }
  return undefined;
}

test('token = base64url(HMAC-SHA256(key, uid)): fixed length, URL-safe, safe in a ds= line', () => {
  const key = randomKey();
  for (const uid of ['a', '0b9d3f2e-7c1a-4d5e-9f00-123456789abc', 'ü'.repeat(100)]) {
    const t = signToken(key, uid);
    assert.equal(t, createHmac('sha256', key).update(uid).digest('base64url'));
    assert.equal(t.length, TOKEN_LENGTH);
    assert.match(t, /^[A-Za-z0-9_-]+$/);
  }
  assert.notEqual(signToken(key, 'a'), signToken(key, 'b'));
  assert.notEqual(signToken(key, 'a'), signToken(randomKey(), 'a'));
});

test('key file: base64 or base64url lines, comments and blanks skipped, first key signs, duplicates dropped', () => {
  const k1 = randomKey();
  const k2 = randomKey();
  const text = `# rotated 2026-11-22\n\n${keyLine(k1)}\r\n${Buffer.from(k2).toString('base64url')}\n${keyLine(k1)}\n`;
  const keys = parseKeyFile(text);
  assert.equal(keys.length, 2);
  assert.deepEqual(keys[0], k1);
  assert.deepEqual(keys[1], k2);
  assert.equal(new DatasourceKeyring(keys).sign('u'), signToken(k1, 'u'));
});

test('weak or malformed keys are refused with DATASOURCE_KEY_INVALID, without quoting the key', () => {
  const short = Buffer.from(randomKey().subarray(0, 31)).toString('base64');
  assert.equal(
    code(() => parseKeyFile(short)),
    'DATASOURCE_KEY_INVALID',
  );
  assert.equal(
    code(() => parseKeyFile(Buffer.alloc(64).toString('base64'))),
    'DATASOURCE_KEY_INVALID',
  ); // all zeros
  assert.equal(
    code(() => parseKeyFile(Buffer.from('ab'.repeat(32)).toString('base64'))),
    'DATASOURCE_KEY_INVALID',
  ); // 2 distinct bytes
  assert.equal(
    code(() => parseKeyFile('this is my secret passphrase, long enough?')),
    'DATASOURCE_KEY_INVALID',
  ); // not base64
  assert.equal(
    code(() => parseKeyFile('# only a comment\n\n')),
    'DATASOURCE_KEY_INVALID',
  );
  assert.equal(
    code(() => new DatasourceKeyring([new Uint8Array(16)])),
    'DATASOURCE_KEY_INVALID',
  );
  assert.equal(
    code(() => new DatasourceKeyring([])),
    'DATASOURCE_KEY_INVALID',
  );
  try {
    parseKeyFile(`${keyLine(randomKey())}\n${short}`, '/etc/vmseed/keys');
    assert.fail('should throw');
  } catch (e) {
    assert.ok(e instanceof VmseedError);
    assert.match(e.message, /line 2 of \/etc\/vmseed\/keys has 31 bytes/);
    assert.ok(!e.message.includes(short));
    assert.equal(e.field, '/etc/vmseed/keys:2');
  }
});

test('verify: accepts a token from any listed key, rejects others and malformed input', () => {
  const a = randomKey();
  const b = randomKey();
  const ring = new DatasourceKeyring([a, b]);
  assert.equal(ring.verify(signToken(a, 'u1'), 'u1'), true);
  assert.equal(ring.verify(signToken(b, 'u1'), 'u1'), true);
  assert.equal(ring.verify(signToken(a, 'u1'), 'u2'), false);
  assert.equal(ring.verify(signToken(randomKey(), 'u1'), 'u1'), false);
  assert.equal(ring.verify(signToken(a, 'u1').slice(1), 'u1'), false);
  assert.equal(ring.verify(signToken(a, 'u1') + 'A', 'u1'), false);
  assert.equal(ring.verify('', 'u1'), false);
  assert.equal(ring.verify('é'.repeat(43), 'u1'), false);
  assert.deepEqual(ring.acceptedTokens('u1'), [signToken(a, 'u1'), signToken(b, 'u1')]);
});

test('reload from a file: rotation steps, generation moves, a bad file keeps the old keys', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-keys-'));
  try {
    const path = join(dir, 'keys');
    const oldKey = randomKey();
    const newKey = randomKey();
    await writeFile(path, keyLine(oldKey) + '\n');
    const source = fileKeySource(path);
    const ring = await DatasourceKeyring.load(source);
    const oldToken = ring.sign('u');
    const g0 = ring.generation;

    await writeFile(path, `${keyLine(newKey)}\n${keyLine(oldKey)}\n`);
    await ring.reload(source);
    assert.ok(ring.generation > g0);
    assert.equal(ring.sign('u'), signToken(newKey, 'u'));
    assert.equal(ring.verify(oldToken, 'u'), true);

    await writeFile(path, 'short\n');
    await assert.rejects(
      ring.reload(source),
      (e: unknown) => e instanceof VmseedError && e.code === 'DATASOURCE_KEY_INVALID',
    );
    assert.equal(ring.size, 2, 'a rejected file must not replace the keys in force');
    assert.equal(ring.verify(oldToken, 'u'), true);

    await writeFile(path, `${keyLine(newKey)}\n`);
    await ring.reload(source);
    assert.equal(ring.verify(oldToken, 'u'), false);

    await assert.rejects(
      DatasourceKeyring.load(fileKeySource(join(dir, 'missing'))),
      (e: unknown) => e instanceof VmseedError && e.code === 'DATASOURCE_KEY_FILE_UNREADABLE' && e.retryable,
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('fingerprints identify keys without revealing them', () => {
  const k = randomKey();
  const ring = new DatasourceKeyring([k]);
  const [fp] = ring.fingerprints();
  assert.match(fp, /^[0-9a-f]{12}$/);
  assert.ok(!Buffer.from(k).toString('hex').includes(fp));
});
