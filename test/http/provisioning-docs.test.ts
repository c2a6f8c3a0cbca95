// docs/provisioning.md states the receiver's limits, the timeline's bounds
// and the VMI annotation's: each number there is the one the code uses; and
// its contract's tables of fields and states are the code's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { REPORT_LIMITS, REPORT_REFUSALS } from '../../src/datasource/reports/receiver.ts';
import { MAX_DESCRIPTION_LENGTH, MAX_NAME_LENGTH } from '../../src/datasource/reports/event.ts';
import { MAX_STAGES, MAX_STEPS } from '../../src/agent/provisioning/timeline.ts';
import { NOT_REPORTED_AFTER_MS, PROVISIONING_STATES as TRACKER_STATES } from '../../src/agent/provisioning/tracker.ts';
import { PROVISIONING_STATES as PANEL_STATES } from '../../src/http/provisioning-panel.ts';
import {
  ANNOTATED_STATES,
  annotationValue,
  MAX_ANNOTATION_LENGTH,
  PROVISIONING_ANNOTATION,
  PROVISIONING_CONTRACT_VERSION,
  provisioningSummary,
  SUMMARY_FIELDS,
  type ProvisioningSummary,
} from '../../src/agent/provisioning/summary.ts';
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

// "The contract (v1)": its tables, first cell of each row (several names in
// one cell allowed), and the other cells.
function contractTable(heading: string): Map<string, string[]> {
  const contract = doc.split('## The contract (v1)')[1]?.split('\n## ')[0] ?? '';
  const table = contract.split(`### ${heading}`)[1]?.split('\n### ')[0] ?? '';
  const out = new Map<string, string[]>();
  for (const line of table.split('\n').filter((l) => l.startsWith('| `'))) {
    const cells = line
      .slice(1, -1)
      .split(' | ')
      .map((c) => c.trim());
    for (const name of cells[0].matchAll(/`([^`]+)`/g)) out.set(name[1], cells.slice(1));
  }
  return out;
}
const names = (cell: string | undefined) => [...(cell ?? '').matchAll(/`([^`]+)`/g)].map((m) => m[1]);

test('the contract documents every field of the annotation, in order, and its version', () => {
  assert.equal(PROVISIONING_CONTRACT_VERSION, 1);
  assert.ok(doc.includes(`## The contract (v${PROVISIONING_CONTRACT_VERSION})`));
  const fields = contractTable('Fields');
  assert.deepEqual([...fields.keys()], [...SUMMARY_FIELDS]);
  assert.match(fields.get('v')?.[2] ?? '', new RegExp(`\`${PROVISIONING_CONTRACT_VERSION}\``));
  // Every key of ProvisioningSummary is listed (checked by tsc).
  const listed: Record<keyof ProvisioningSummary, true> = Object.fromEntries(
    SUMMARY_FIELDS.map((f) => [f, true]),
  ) as Record<(typeof SUMMARY_FIELDS)[number], true>;
  assert.equal(Object.keys(listed).length, SUMMARY_FIELDS.length);
});

test('the contract documents every state, and each state and transition it names is one the code has', () => {
  const states = contractTable('States');
  assert.deepEqual([...states.keys()], [...ANNOTATED_STATES]);
  for (const s of [...TRACKER_STATES, ...PANEL_STATES]) assert.ok(states.has(s), s);
  for (const [state, [, next]] of states)
    for (const n of names(next)) assert.ok((ANNOTATED_STATES as readonly string[]).includes(n), `${state} -> ${n}`);
  // Each field's "when" names states only, or says always / all but.
  for (const [field, [, when]] of contractTable('Fields'))
    for (const n of names(when)) assert.ok((ANNOTATED_STATES as readonly string[]).includes(n), `${field}: ${n}`);
});

test('what the code writes for each state is what the fields table says it carries', () => {
  const fields = contractTable('Fields');
  const carries = (field: string, state: string) => {
    const when = fields.get(field)?.[1] ?? '';
    if (when === 'always') return true;
    return when.startsWith('all but') ? !names(when).includes(state) : names(when).includes(state);
  };
  const at = '2026-11-26T02:41:07.512Z';
  const finished = {
    boot: 1,
    firstEventAt: at,
    finishedAt: at,
    seconds: 48.34,
    result: 'SUCCESS' as const,
    stages: [],
  };
  const samples: Record<string, ProvisioningSummary | undefined> = {
    'seed-read': provisioningSummary(undefined, Date.parse(at)),
    running: provisioningSummary(
      { state: 'running', boot: 1, firstEventAt: at, stages: [{ name: 'init-network', modules: [] }] },
      undefined,
    ),
    succeeded: provisioningSummary({ state: 'succeeded', ...finished, sentinel: 'unverified' }, undefined),
    bootstrapped: provisioningSummary({ state: 'bootstrapped', ...finished, sentinel: 'written' }, undefined),
    failed: provisioningSummary(
      { state: 'failed', ...finished, result: 'FAIL', failure: { step: 'modules-final/config-scripts-user' } },
      undefined,
    ),
    'not-reported': provisioningSummary({ state: 'not-reported', boot: 0, stages: [], reason: 'why' }, Date.parse(at)),
  };
  for (const state of ANNOTATED_STATES) {
    const s = samples[state];
    assert.ok(s, state);
    assert.equal(s.state, state);
    assert.equal(Object.keys(s)[0], 'v');
    assert.ok(annotationValue(s).startsWith(`{"v":${PROVISIONING_CONTRACT_VERSION},`));
    for (const key of Object.keys(s)) assert.ok(carries(key, state), `${state} carries ${key}`);
    for (const field of SUMMARY_FIELDS)
      if (carries(field, state) && field !== 'sentinel') assert.ok(field in s, `${state} lacks ${field}`);
  }
});
