// A guest that asked for its seed before it was served is told apart from
// one that asked after: the miss is remembered per token, within bounds a
// sprayer cannot lift, and counts only when that token later gets the seed.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import pino from 'pino';
import {
  EARLY_MISS_TTL_MS,
  EARLY_MISSES_MAX,
  EARLY_MISSES_PER_SOURCE,
  EarlyMisses,
} from '../../src/datasource/early.ts';
import { startDatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { MapDirectory, nocloudSeed, randomKey } from './datasource-fixtures.ts';

const token = (i: number) => `tok${String(i).padStart(40, '0')}`;
const at = (ms: number) => new Date(1_700_000_000_000 + ms);

test('a miss is reported once, when its token is served; a token never missed reports nothing', () => {
  const early = new EarlyMisses();
  early.missed(token(1), '10.0.0.1', at(0), 0);
  early.missed(token(1), '10.0.0.1', at(500), 500);
  assert.equal(early.size, 1, 'the first miss of a token is kept');
  assert.equal(early.served(token(2), 600), undefined);
  assert.deepEqual(early.served(token(1), 1_000), at(0));
  assert.equal(early.served(token(1), 1_100), undefined, 'reported once');
  assert.equal(early.size, 0);
});

test('bounds: per source address, in all (oldest out), and by age', () => {
  const early = new EarlyMisses({ max: 8, perSource: 3, ttlMs: 1_000 });
  for (let i = 0; i < 10; i++) early.missed(token(i), 'sprayer', at(i), i);
  assert.equal(early.size, 3, 'one address holds at most its share');
  assert.deepEqual(early.served(token(0), 20), at(0), "the sprayer's first misses are the ones kept");
  assert.equal(early.served(token(5), 20), undefined);
  // Many addresses: the whole map stays bounded, the oldest going first.
  const fresh = new EarlyMisses({ max: 8, perSource: 3, ttlMs: 1_000 });
  for (let i = 0; i < 20; i++) fresh.missed(token(100 + i), `10.0.0.${i}`, at(i), i);
  assert.equal(fresh.size, 8);
  assert.equal(fresh.served(token(100), 30), undefined, 'oldest pushed out');
  assert.deepEqual(fresh.served(token(119), 30), at(19));
  // Past the TTL a miss says nothing about the boot that gets the seed.
  fresh.missed(token(200), 'late', at(40), 40);
  assert.equal(fresh.served(token(200), 40 + 1_000), undefined, 'expired');
  assert.equal(fresh.size, 0, 'expired entries are dropped');
  // A freed share is reusable.
  const again = new EarlyMisses({ max: 8, perSource: 1, ttlMs: 1_000 });
  again.missed(token(1), 's', at(0), 0);
  again.served(token(1), 1);
  again.missed(token(2), 's', at(2), 2);
  assert.equal(again.size, 1);
});

test("docs/kubevirt.md states the datasource's early-miss bounds as the code has them", () => {
  const readme = readFileSync(new URL('../../docs/kubevirt.md', import.meta.url), 'utf8');
  const m = /at most (\d+) per source address and ([\d,]+) in all, the oldest going\s+first, each for an hour/.exec(
    readme,
  );
  assert.ok(m, 'early-miss bounds in docs/kubevirt.md');
  assert.equal(Number(m[1]), EARLY_MISSES_PER_SOURCE);
  assert.equal(Number(m[2].replace(/,/g, '')), EARLY_MISSES_MAX);
  assert.equal(EARLY_MISS_TTL_MS, 60 * 60_000);
});

test(
  'datasource: a token that found no seed and later got it is reported seeded after boot; sprayed tokens are not',
  { timeout: 30_000 },
  async (t) => {
    const dir = new MapDirectory();
    const keyring = new DatasourceKeyring([randomKey()]);
    const server = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: pino({ level: 'silent' }),
    });
    t.after(() => server.close());
    const get = async (tok: string, file = 'meta-data') => (await fetch(`${server.baseUrl}/${tok}/${file}`)).status;

    dir.add({ namespace: 'ns', name: 'on-time', uid: 'uid-on-time', seed: nocloudSeed('on-time') });
    // The early guest asks before its VMI has a seed; others spray made-up tokens.
    const early = keyring.sign('uid-early');
    assert.equal(await get(early), 404);
    for (let i = 0; i < 5; i++) assert.equal(await get(token(i)), 404);
    assert.equal(await get(keyring.sign('uid-on-time')), 200);
    assert.deepEqual(dir.late, [], 'served on its first ask: not late');

    dir.add({ namespace: 'ns', name: 'early', uid: 'uid-early', seed: nocloudSeed('early') });
    const before = Date.now();
    assert.equal(await get(early, 'user-data'), 200);
    assert.equal(await get(early, 'meta-data'), 200);
    const late = dir.late as MapDirectory['late'];
    assert.equal(late.length, 1, 'reported once');
    assert.equal(late[0].uid, 'uid-early');
    assert.ok(late[0].missedAt.getTime() <= late[0].servedAt.getTime());
    assert.ok(late[0].servedAt.getTime() >= before);
    // A path that names no file is no miss of a seed.
    dir.add({ namespace: 'ns', name: 'bare', uid: 'uid-bare', seed: nocloudSeed('bare') });
    const bare = keyring.sign('uid-bare');
    assert.equal(await get(bare, 'no-such-file'), 404);
    assert.equal(await get(bare), 200);
    assert.equal(dir.late.length, 1);
  },
);
