// docs/provisioning.md states the receiver's limits, the timeline's bounds
// and the VMI annotation's: each number there is the one the code uses.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { REPORT_LIMITS, REPORT_REFUSALS } from '../../src/datasource/reports/receiver.ts';
import { MAX_DESCRIPTION_LENGTH, MAX_NAME_LENGTH } from '../../src/datasource/reports/event.ts';
import { MAX_STAGES, MAX_STEPS } from '../../src/agent/provisioning/timeline.ts';
import { NOT_REPORTED_AFTER_MS } from '../../src/agent/provisioning/tracker.ts';
import { MAX_ANNOTATION_LENGTH, PROVISIONING_ANNOTATION } from '../../src/agent/provisioning/summary.ts';
import { FORBIDDEN_RETRY_MS, MIN_INTERVAL_MS, SWEEP_MS } from '../../src/agent/provisioning/annotation-writer.ts';

const doc = readFileSync(new URL('../../docs/provisioning.md', import.meta.url), 'utf8');
const rows = new Map(
  doc
    .split('\n')
    .filter((l) => l.startsWith('| `'))
    .map((l) =>
      l
        .slice(1, -1)
        .split(' | ')
        .map((c) => c.trim()),
    )
    .map((cells) => [cells[0], cells]),
);

test('the documented receiver limits are the code defaults', () => {
  // `100 / 1000 per source address` -> `100 / 1000`.
  const pair = (a: keyof typeof REPORT_LIMITS, b: keyof typeof REPORT_LIMITS) =>
    rows.get(`\`${a}\` / \`${b}\``)?.[1].split(' ').slice(0, 3).join(' ');
  assert.equal(
    pair('perSourceRatePerSecond', 'perSourceBurst'),
    `${REPORT_LIMITS.perSourceRatePerSecond} / ${REPORT_LIMITS.perSourceBurst}`,
  );
  assert.equal(
    pair('perVmRatePerSecond', 'perVmBurst'),
    `${REPORT_LIMITS.perVmRatePerSecond} / ${REPORT_LIMITS.perVmBurst}`,
  );
  assert.equal(
    pair('globalRatePerSecond', 'globalBurst'),
    `${REPORT_LIMITS.globalRatePerSecond} / ${REPORT_LIMITS.globalBurst}`,
  );
  assert.equal(rows.get('`maxBodyBytes`')?.[1], String(REPORT_LIMITS.maxBodyBytes));
  assert.equal(rows.get('`maxInFlight`')?.[1].split(' ')[0], String(REPORT_LIMITS.maxInFlight));
});

test('every refusal reason the counter has is in the documented table', () => {
  const table = doc.split('### Limits')[1].split('\n## ')[0];
  for (const reason of REPORT_REFUSALS) {
    if (reason === 'method' || reason === 'aborted') continue;
    assert.ok(table.includes(`\`${reason}\``), reason);
  }
});

test('the documented bounds of descriptions, names, steps and the not-reported wait are the code constants', () => {
  assert.match(doc, new RegExp(`cut to ${MAX_DESCRIPTION_LENGTH} characters`));
  assert.match(doc, new RegExp(`1 to ${MAX_NAME_LENGTH} characters`));
  assert.match(doc, new RegExp(`at most \`${MAX_STAGES}\` stages and \`${MAX_STEPS}\` steps`));
  assert.match(doc, new RegExp(`within \`${NOT_REPORTED_AFTER_MS / 60_000}\` minutes`));
});

test("the documented bounds of the VMI's provisioning annotation are the code's", () => {
  const section = doc.split('## With kubectl only')[1]?.replace(/\s+/g, ' ') ?? '';
  assert.ok(section.includes(`\`${PROVISIONING_ANNOTATION}\``));
  assert.ok(section.includes(`at most once every \`${MIN_INTERVAL_MS / 1000}\` s per VMI`));
  assert.ok(section.includes(`the sweep every \`${SWEEP_MS / 1000}\` s`));
  assert.ok(section.includes(`pauses every write for \`${FORBIDDEN_RETRY_MS / 1000}\` s`));
  assert.ok(section.includes(`under \`${MAX_ANNOTATION_LENGTH}\` characters`));
});
