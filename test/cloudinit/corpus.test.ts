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
import { loadAll } from 'js-yaml';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import { CORPUS_DIR, caseNames, readTree, runCase } from './corpus-lib.ts';

const update = process.env.UPDATE_SEED_FIXTURES === '1';

// What a message that tells the user what to do says: an instruction, or
// what the field must be or needs.
const FIX =
  /\b(use|set|add|remove|create|fix|keep|make|put|omit|shrink|encode|write|quote|give|list|change|raise|must|needs?|requires?|known)\b/i;
const ANNOTATION = 'vmseed.io/cloud-init';

// Whether `message` names `field`: verbatim; as "annotation <name>: <path>"
// for the annotation's own fields; as the indexed element plus the key (as
// KubeVirt's own messages do); or, for a volume, by its name.
function namesField(message: string, field: string, volumes: string[]): boolean {
  if (field === '') return false;
  if (message.includes(field)) return true;
  if (
    field.startsWith(`${ANNOTATION}.`) &&
    message.includes(ANNOTATION) &&
    message.includes(field.slice(ANNOTATION.length + 1))
  )
    return true;
  const indexed = /^(.*\[\d+\])\.(?:.*\.)?([^.]+)$/.exec(field);
  if (indexed && message.includes(indexed[1]) && message.includes(indexed[2])) return true;
  const volume = /^spec\.volumes\[(\d+)\]$/.exec(field);
  return (
    volume !== null && volumes[Number(volume[1])] !== undefined && message.includes(`"${volumes[Number(volume[1])]}"`)
  );
}

// The volume names of a case's VMI, read from its manifest as written.
function volumeNames(dir: string): string[] {
  const vmi = loadAll(readFileSync(join(dir, 'vmi.yaml'), 'utf8')).find(
    (d) => (d as { kind?: string } | null)?.kind === 'VirtualMachineInstance',
  ) as { spec?: { volumes?: Array<{ name?: string }> } } | undefined;
  return (vmi?.spec?.volumes ?? []).map((v) => v.name ?? '');
}
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
      // Messages name the field and say what to do.
      assert.equal(
        namesField(result.error.message, field, volumeNames(dir)),
        true,
        `the message does not name ${field}: ${result.error.message}`,
      );
      assert.match(result.error.message, FIX, 'the message does not say what to do');
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
