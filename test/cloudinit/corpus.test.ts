// The seed corpus: every case under test/fixtures/seeds/<case>/ is a VMI (plus
// Secrets) and the seed files exactly as the image will hold them, or the
// expected error / skip. Files are compared byte for byte; meta-data is the
// compact JSON.stringify(seed.metaData) that serializeMetaData writes, which
// is also what the disk layout puts in the image.
//
// UPDATE_SEED_FIXTURES=1 rewrites the expected files (review the diff!).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync, existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import { CORPUS_DIR, caseNames, readTree, runCase } from './corpus-lib.ts';

const update = process.env.UPDATE_SEED_FIXTURES === '1';
const names = caseNames();

test('the corpus has at least 40 cases', () => {
  assert.ok(names.length >= 40, `only ${names.length} cases`);
});

for (const name of names) {
  test(`seed corpus: ${name}`, async () => {
    const dir = join(CORPUS_DIR, name);
    const result = await runCase(name);
    const expectedDir = join(dir, 'expected');
    const errorFile = join(dir, 'expected-error.txt');
    const skipFile = join(dir, 'expected-skip.txt');
    const warningsFile = join(dir, 'expected-warnings.txt');

    if (update) {
      for (const f of [expectedDir, errorFile, skipFile, warningsFile]) rmSync(f, { recursive: true, force: true });
      if ('error' in result) {
        const e = result.error;
        writeFileSync(errorFile, `${e.code}\n${e.kind}\n${e.field ?? ''}\n# ${e.message}\n`);
      } else if (result.outcome.kind === 'skip') {
        writeFileSync(skipFile, `${result.outcome.warning?.code ?? ''}\n# ${result.outcome.reason}\n`);
      } else {
        for (const f of serializeMetaData(result.outcome.seed)) {
          mkdirSync(dirname(join(expectedDir, f.path)), { recursive: true });
          writeFileSync(join(expectedDir, f.path), f.bytes);
        }
        const w = result.outcome.seed.warnings;
        if (w.length > 0) writeFileSync(warningsFile, w.map((x) => `${x.code} ${x.field ?? ''}\n`).join(''));
      }
      return;
    }

    if (existsSync(errorFile)) {
      const [code, kind, field] = readFileSync(errorFile, 'utf8').split('\n');
      assert.ok('error' in result, `expected error ${code}, got ${'outcome' in result ? result.outcome.kind : ''}`);
      assert.equal(result.error.code, code);
      assert.equal(result.error.kind, kind);
      assert.equal(result.error.field ?? '', field);
      // Messages say what to do and never quote the data.
      assert.ok(result.error.message.length > 30, result.error.message);
      return;
    }
    if ('error' in result) assert.fail(`unexpected error ${result.error.code}: ${result.error.message}`);
    if (existsSync(skipFile)) {
      const [warning] = readFileSync(skipFile, 'utf8').split('\n');
      assert.equal(result.outcome.kind, 'skip');
      if (result.outcome.kind === 'skip') assert.equal(result.outcome.warning?.code ?? '', warning);
      return;
    }
    assert.equal(result.outcome.kind, 'seed');
    if (result.outcome.kind !== 'seed') return;
    const seed = result.outcome.seed;
    const expected = readTree(expectedDir);
    assert.ok(expected.size >= 2, `case ${name} has no expected files`);
    const actual = new Map(serializeMetaData(seed).map((f) => [f.path, Buffer.from(f.bytes)]));
    assert.deepEqual([...actual.keys()].sort(), [...expected.keys()].sort());
    for (const [path, bytes] of expected) {
      assert.ok(
        bytes.equals(actual.get(path)!),
        `${path} differs:\n${actual.get(path)?.toString()}\n---expected---\n${bytes.toString()}`,
      );
    }
    const expectedWarnings = existsSync(warningsFile)
      ? readFileSync(warningsFile, 'utf8').split('\n').filter(Boolean)
      : [];
    assert.deepEqual(
      seed.warnings.map((x) => `${x.code} ${x.field ?? ''}`),
      expectedWarnings,
    );
  });
}
