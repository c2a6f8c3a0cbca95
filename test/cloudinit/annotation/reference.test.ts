// The annotation reference (docs/reference/annotation.md) documents exactly the fields the annotation
// parser knows: every field has a row, and every row is a field.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { ANNOTATION, ANNOTATION_FIELDS, parseAnnotation } from '../../../src/cloudinit/annotation/annotation.ts';
import {
  FILE_FIELDS,
  INIT_FIELDS,
  NIC_FIELDS,
  USER_FIELDS,
  parseInit,
} from '../../../src/cloudinit/init/init-parse.ts';

const reference = readFileSync(new URL('../../../docs/reference/annotation.md', import.meta.url), 'utf8');
// Only the fields' section: the page may have other tables.
const start = reference.indexOf('\n## Fields\n');
assert.ok(start >= 0, 'docs/reference/annotation.md: ## Fields');
const end = reference.indexOf('\n## ', start + 1);
const doc = reference.slice(start, end < 0 ? undefined : end);
const rows = doc
  .split('\n')
  .filter((l) => l.startsWith('| `'))
  .map((l) => l.split(/(?<!\\)\|/).map((c) => c.trim()));
const documented = rows.map((r) => r[1].replace(/`/g, ''));

const known = [
  ...ANNOTATION_FIELDS,
  ...INIT_FIELDS.map((f) => `init.${f}`),
  ...USER_FIELDS.map((f) => `init.users[].${f}`),
  ...NIC_FIELDS.map((f) => `init.nics[].${f}`),
  ...FILE_FIELDS.map((f) => `init.files[].${f}`),
];

test('every field the parser knows is documented, and nothing else', () => {
  assert.deepEqual([...documented].sort(), [...new Set(known)].sort());
  assert.equal(new Set(documented).size, documented.length, 'a field has two rows');
});

test('every row has a type, default, example and datasource', () => {
  for (const r of rows) {
    assert.equal(r.length, 8, r[1]);
    for (const cell of r.slice(2, 7)) assert.ok(cell !== '', `${r[1]} has an empty cell`);
  }
});

test('the parser rejects a field the table does not have', () => {
  assert.throws(() => parseAnnotation('sshkeys: []\n'), { code: 'ANNOTATION_INVALID', field: `${ANNOTATION}.sshkeys` });
  assert.throws(() => parseInit({ nics: [{ name: 'eth0', dhcp: true }] }, 'init'), {
    code: 'INIT_INVALID',
    field: 'init.nics[0].dhcp',
  });
});
