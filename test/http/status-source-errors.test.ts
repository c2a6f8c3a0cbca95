// Local mode's broken manifests on the status page and in /status.json:
// the watch is degraded, each file's error is listed with the VMIs whose
// seed may lag it, and those VMIs' rows say stale and why.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderStatusPage, renderVmiPage, statusJson } from '../../src/http/status-page.ts';
import type { SourceError } from '../../src/status/snapshot.ts';
import { sampleSnapshot, vmi } from '../support/fake-status.ts';

const now = new Date('2026-11-22T03:00:00.000Z');
const EVIL = `<script>alert("x")</script>'&`;

const broken: SourceError = {
  file: `team/${EVIL}.yaml`,
  code: 'MANIFEST_INVALID',
  message: `team/${EVIL}.yaml: YAML error at line 3, column 1: bad indentation`,
  at: '2026-11-22T02:59:00.000Z',
  vmis: ['default/a'],
};
const staleA = vmi({
  namespace: 'default',
  name: 'a',
  state: 'ready',
  stale: {
    code: 'SOURCE_STALE',
    message: `manifest ${broken.file} does not read or parse (MANIFEST_INVALID); the seed is from the last version of it that did`,
    field: broken.file,
    at: broken.at,
  },
});

function snapshot(errors: SourceError[] | undefined) {
  const s = sampleSnapshot();
  s.watch = { ...s.watch, mode: 'local', synced: true, connected: true, stale: false, sourceErrors: errors };
  s.vmis = errors?.length ? [staleA, vmi({ namespace: 'default', name: 'b', state: 'ready' })] : [];
  return s;
}

test('a broken manifest: the watch is degraded, the file and its stale VMIs are listed, all escaped', () => {
  const html = renderStatusPage(snapshot([broken]), { now, refreshSeconds: 10 });
  assert.match(
    html,
    /<section class="panel" id="watch" data-health="degraded"><h2>Watch <span class="badge b-warn">degraded<\/span>/,
  );
  assert.match(html, /<th>manifests<\/th><td class="err">1 broken/);
  const panel = /<section class="panel" id="source-errors">.*?<\/section>/s.exec(html)?.[0] ?? '';
  assert.ok(panel.includes('<code>MANIFEST_INVALID</code>'), panel);
  assert.ok(panel.includes('<a href="/status/default/a">default/a</a>'), panel);
  assert.ok(!html.includes('<script'), 'escaped');
  // The row of a says stale, with the reason; b's does not.
  const rowA = /<tr class="vmi r-ready" data-state="ready" data-stale="true">.*?<\/tr>/s.exec(html)?.[0] ?? '';
  assert.match(rowA, /<span class="badge b-warn" title="manifest team\/.*">stale<\/span>/);
  assert.match(rowA, /<code>SOURCE_STALE<\/code>/);
  assert.equal([...html.matchAll(/data-stale="true"/g)].length, 1);
  assert.match(
    renderVmiPage(snapshot([broken]), staleA, { now }),
    /<span class="badge b-warn">stale<\/span>.*SOURCE_STALE/s,
  );
});

test('/status.json carries the source errors and each stale VMI with its reason', () => {
  const j = statusJson(snapshot([broken]), undefined, now);
  assert.deepEqual(j.watch.sourceErrors, [broken]);
  assert.equal(j.vmis.find((v) => v.name === 'a')?.stale?.code, 'SOURCE_STALE');
  assert.equal(j.vmis.find((v) => v.name === 'b')?.stale, undefined);
  // A field that is not declared does not pass.
  const extra = snapshot([{ ...broken, secret: 'x' } as SourceError]);
  assert.deepEqual(statusJson(extra, undefined, now).watch.sourceErrors, [broken]);
});

test('every manifest parses: healthy, no panel; a watch that is down stays unhealthy', () => {
  const ok = renderStatusPage(snapshot([]), { now });
  assert.match(ok, /data-health="healthy"/);
  assert.match(ok, /<th>manifests<\/th><td>all parse<\/td>/);
  assert.ok(!ok.includes('id="source-errors"'));
  // The informer's watch has no manifests row at all.
  assert.ok(!renderStatusPage(snapshot(undefined), { now }).includes('<th>manifests</th>'));
  const down = snapshot([broken]);
  down.watch.connected = false;
  assert.match(renderStatusPage(down, { now }), /data-health="unhealthy"/);
});
