// The limits docs/imds.md states for the IMDS endpoints are the code's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { IMDS_GUARD_DEFAULTS } from '../../src/datasource/imds/guards.ts';
import { IMDS_FAMILIES } from '../../src/datasource/imds/imds-paths.ts';
import { IMDS_OPT_IN } from '../../src/datasource/imds/facts.ts';

const doc = readFileSync(new URL('../../docs/imds.md', import.meta.url), 'utf8');
// Line breaks in prose are spaces.
const flat = (t: string) => t.replace(/\s+/g, ' ');
const section = flat(doc.slice(doc.indexOf('## Every IMDS endpoint'), doc.indexOf('## What guests ask for')));
const n = (v: number) => v.toLocaleString('en-US');

test('docs/imds.md: the IMDS guards, opt-in and metric families as the code has them', () => {
  const d = IMDS_GUARD_DEFAULTS;
  assert.ok(section.length > 0);
  assert.match(section, new RegExp(`a bucket per VMI: ${n(d.ratePerSecond)} requests/s, burst ${n(d.burst)}`));
  assert.match(section, new RegExp(`node-wide bucket of ${n(d.nodeRatePerSecond)}/s, burst ${n(d.nodeBurst)}`));
  assert.equal(d.maxHeaderBytes, 1024);
  assert.match(section, /1 KiB of header fields on these paths → 431/);
  assert.ok(section.includes(`\`${IMDS_OPT_IN}: "true"\``));
  assert.ok(section.includes(IMDS_FAMILIES.map((f) => `\`${f}\``).join(', ')));
  const threat = flat(readFileSync(new URL('../../docs/threat-model.md', import.meta.url), 'utf8'));
  assert.match(threat, new RegExp(`own bucket \\(${n(d.ratePerSecond)} requests/s, burst ${n(d.burst)}`));
  assert.match(threat, new RegExp(`the node one behind them \\(${n(d.nodeRatePerSecond)}/s\\)`));
});
