// The settle interval and resync period the local-mode tour (docs/local-mode.md) and
// docs/operations.md state are the code's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { SETTLE_MS } from '../../src/agent/local/local-vmi-source.ts';
import { AGENT_FLAGS } from '../../src/config/flags.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';

const read = (path: string) => readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');

function section(text: string, heading: string): string {
  const start = text.indexOf(`\n${heading}\n`);
  assert.ok(start >= 0, `no section ${heading}`);
  const rest = text.slice(start + heading.length + 2);
  const end = rest.search(/\n#{1,3} /);
  return end < 0 ? rest : rest.slice(0, end);
}

const tour = section(read('docs/local-mode.md'), '## A tour of local mode');
const ops = section(read('docs/operations.md'), "### Local mode's manifests");

test('the documented settle interval is SETTLE_MS', () => {
  for (const [where, text] of [
    ['docs/local-mode.md', tour],
    ['docs/operations.md', ops],
  ] as const) {
    const said = /(\d+) ms \(the settle\s+interval\)|settle interval,\s+(\d+) ms/.exec(text);
    assert.ok(said, `${where} names the settle interval`);
    assert.equal(Number(said[1] ?? said[2]), SETTLE_MS, where);
  }
});

test('the documented resync period is the flag default, and the gauge is the one exported', async () => {
  assert.equal(AGENT_FLAGS['resync-period'].default, '10m');
  assert.match(ops, /`--resync-period`, 10 minutes/);
  const names = (await createMetrics({ version: 't', processMetrics: false }).registry.getMetricsAsJSON()).map(
    (m) => m.name,
  );
  for (const text of [tour, ops]) {
    assert.match(text, /`vmseed_source_errors`/);
    assert.match(text, /`SOURCE_STALE`/);
  }
  assert.ok(names.includes('vmseed_source_errors'));
});
