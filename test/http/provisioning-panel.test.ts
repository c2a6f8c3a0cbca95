// What the guest reported reaches the page escaped, whatever it holds: the
// step names and descriptions come from the guest.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderStatusPage, renderVmiPage, statusJson } from '../../src/http/status-page.ts';
import { sampleSnapshot, vmi } from '../support/fake-status.ts';
import type { ProvisioningStatus } from '../../src/status/snapshot.ts';

const EVIL = `<script>alert("x")</script><img src=x onerror=alert(1)>'&`;

function hostile(): ProvisioningStatus {
  const step = {
    name: EVIL,
    startedAt: EVIL,
    finishedAt: EVIL,
    seconds: 1,
    result: 'FAIL' as const,
    description: EVIL,
  };
  return {
    state: 'failed',
    boot: 2,
    seenAt: EVIL,
    stages: [{ ...step, modules: [step] }],
    failure: { step: EVIL, description: EVIL },
    reason: EVIL,
  };
}

test('the timeline, the list line and the node panel escape every reported string', () => {
  const s = sampleSnapshot();
  s.vmis = [vmi({ namespace: 'ns', state: 'ready', name: 'vm1', provisioning: hostile() })];
  const now = new Date('2026-11-22T03:00:00Z');
  for (const html of [renderVmiPage(s, s.vmis[0], { now }), renderStatusPage(s, { now })]) {
    assert.ok(!html.includes('<script>alert'), 'script reflected');
    assert.ok(!html.includes('<img src=x'), 'img reflected');
  }
  const page = renderVmiPage(s, s.vmis[0], { now });
  assert.ok(page.includes('&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;'));
  assert.match(page, /id="provisioning-timeline" data-provisioning="failed"/);
  assert.match(renderStatusPage(s, { now }), /id="provisioning"/);
});

test('status.json carries the projected provisioning and the node-wide counts, nothing more', () => {
  const s = sampleSnapshot();
  const extra = { ...hostile(), secret: 'user-data bytes' } as ProvisioningStatus;
  s.vmis = [
    vmi({ namespace: 'ns', state: 'ready', name: 'vm1', provisioning: extra }),
    vmi({ namespace: 'ns', state: 'ready', name: 'vm2' }),
  ];
  const j = statusJson(s, undefined, new Date());
  assert.equal(j.vmis[0].provisioning?.state, 'failed');
  assert.ok(!JSON.stringify(j).includes('user-data bytes'));
  assert.deepEqual(j.provisioningCounts, { running: 0, failed: 1, succeeded: 0, bootstrapped: 0, 'not-reported': 0 });
});
