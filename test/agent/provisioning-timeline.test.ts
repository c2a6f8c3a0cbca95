// The per-VMI timeline: new boots never mixed with the last one, bounds on
// what a guest can make the agent keep, module labels folded to a closed
// set, and a guest looping through boots cannot flood the API with Events.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import pino from 'pino';
import { applyEvent, moduleLabel, MAX_STEPS, type ProvisioningFacts } from '../../src/agent/provisioning/timeline.ts';
import { EVENT_MIN_INTERVAL_MS, ProvisioningTracker } from '../../src/agent/provisioning/tracker.ts';
import { VmiRecords } from '../../src/agent/vmi-records.ts';
import type { EventRecorder } from '../../src/agent/events.ts';
import type { ReportedEvent } from '../../src/datasource/reports/event.ts';
import { parseReportedEvent } from '../../src/datasource/reports/event.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { parseExposition, sampleValue } from '../support/promtool.ts';

const fixture = (file: string) =>
  (JSON.parse(readFileSync(new URL(`../fixtures/cloud-init-events/${file}`, import.meta.url), 'utf8')) as object[]).map(
    (e) => {
      const p = parseReportedEvent(JSON.stringify(e));
      assert.ok(p.ok);
      return p.event;
    },
  );
const BOOT = fixture('boot-success.json');

function run(events: ReportedEvent[], start?: ProvisioningFacts, uid = 'u1'): ProvisioningFacts {
  let f = start;
  let at = 1000;
  for (const e of events) f = applyEvent(f, uid, e, at++).facts;
  return f!;
}

const ev = (name: string, type: 'start' | 'finish', result?: 'SUCCESS' | 'FAIL'): ReportedEvent => ({
  name,
  type,
  timestamp: 1,
  description: '',
  ...(result ? { result } : {}),
});

test("a whole boot from cloud-init's own events: four stages, done, SUCCESS", () => {
  const f = run(BOOT);
  assert.equal(f.boot, 1);
  assert.deepEqual(
    f.stages.map((s) => s.name),
    ['init-local', 'init-network', 'modules-config', 'modules-final'],
  );
  assert.equal(f.result, 'SUCCESS');
  assert.ok(f.finishedAt !== undefined);
});

test('a second boot starts a new timeline: init-local again, or a stage started twice', () => {
  const first = run(BOOT);
  const again = run([BOOT[0]], first);
  assert.equal(again.boot, 2);
  assert.equal(again.stages.length, 1);
  assert.equal(again.finishedAt, undefined);
  // A first boot reported from mid init-network, then a second without init-local.
  const partial = run([ev('init-network/config-runcmd', 'finish', 'SUCCESS'), ev('init-network', 'finish', 'SUCCESS')]);
  assert.equal(partial.boot, 1);
  const next = run([ev('init-network', 'start')], partial);
  assert.equal(next.boot, 1, 'init-network had not started in the first: same boot');
  const third = run([ev('init-network', 'finish', 'SUCCESS')], next);
  assert.equal(third.boot, 2, 'finished twice: a new boot');
  // Another object under the key starts over.
  assert.equal(run([BOOT[0]], first, 'u2').boot, 1);
});

test('a guest cannot make the agent keep more than the bound of steps', () => {
  const many = Array.from({ length: MAX_STEPS + 50 }, (_, i) => ev(`init-network/step-${i}`, 'start'));
  const f = run(many);
  assert.equal(
    f.stages.reduce((n, s) => n + s.steps.length, 0),
    MAX_STEPS,
  );
  assert.equal(f.dropped, 50);
});

// cloud-init finishes a stage with the worst result of its steps, so a
// failing module is always followed by its stage's own FAIL: the module is
// what failed, the stage only carries it.
test("the first failing step is the failure, not its stage's FAIL that follows", () => {
  const f = run([
    ev('modules-final', 'start'),
    ev('modules-final/config-scripts-user', 'start'),
    { ...ev('modules-final/config-scripts-user', 'finish', 'FAIL'), description: 'scripts-user failed' },
    ev('modules-final/config-final-message', 'start'),
    { ...ev('modules-final/config-final-message', 'finish', 'FAIL'), description: 'final-message failed' },
    { ...ev('modules-final', 'finish', 'FAIL'), description: 'running modules for final' },
  ]);
  assert.deepEqual(f.failure, { step: 'modules-final/config-scripts-user', description: 'scripts-user failed' });
  assert.equal(f.result, 'FAIL');
  assert.equal(f.stages[0].result, 'FAIL', "the stage's own result is still kept");
  assert.ok(f.finishedAt !== undefined);

  // The same from the events cloud-init 22.4's own reporting code posts.
  const recorded = run(fixture('boot-scripts-user-fails.json'));
  assert.equal(recorded.failure?.step, 'modules-final/config-scripts-user');
  assert.equal(moduleLabel(recorded.failure.step), 'scripts_user');
});

test('module labels are cloud-init module names in either spelling, anything else other', () => {
  assert.equal(moduleLabel('modules-final/config-scripts-user'), 'scripts_user');
  assert.equal(moduleLabel('modules-final/config-scripts_user'), 'scripts_user');
  assert.equal(moduleLabel('init-network/config-evil-label-1234'), 'other');
  assert.equal(moduleLabel('init-network/check-cache'), 'other');
});

test('a guest looping through boots gets one provisioning Event per interval, every boot still shown', () => {
  const records = new VmiRecords();
  const r = records.of('ns/vm');
  r.status = { namespace: 'ns', name: 'vm', uid: 'u1', state: 'ready', warnings: [], retries: 0 };
  const vmi = { metadata: { namespace: 'ns', name: 'vm', uid: 'u1' }, spec: {} };
  const recorded: string[] = [];
  const events: EventRecorder = { record: (_v, _t, reason) => void recorded.push(reason), flush: async () => {} };
  const tracker = new ProvisioningTracker({
    records,
    vmiOf: () => vmi,
    events,
    logger: pino({ level: 'silent' }),
  });
  const entry = { namespace: 'ns', name: 'vm', uid: 'u1', seed: undefined as never };
  let at = Date.parse('2026-01-01T00:00:00Z');
  for (let boot = 0; boot < 20; boot++)
    for (const e of [ev('init-local', 'start'), ev('modules-final', 'finish', 'SUCCESS')])
      assert.ok(tracker.report(entry, e, new Date((at += 100))));
  assert.deepEqual(recorded, ['ProvisioningSucceeded']);
  assert.equal(tracker.status(r, at)?.boot, 20);
  at += 31_000;
  tracker.report(entry, ev('init-local', 'start'), new Date(at));
  tracker.report(entry, ev('modules-final', 'finish', 'FAIL'), new Date(at + 1));
  assert.deepEqual(recorded, ['ProvisioningSucceeded', 'ProvisioningFailed']);
});

// A reboot keeps the instance (same VMI, same UID, so the same instance-id):
// cloud-init runs its four stages again and reports them.
test('a second boot of the same instance is reported as boot 2: its own stages, result and time, nothing of boot 1', async () => {
  const records = new VmiRecords();
  const r = records.of('ns/vm');
  const t0 = Date.parse('2026-01-01T00:00:00Z');
  r.status = { namespace: 'ns', name: 'vm', uid: 'u1', state: 'ready', warnings: [], retries: 0 };
  r.firstSeen = { uid: 'u1', at: t0, reported: true };
  const vmi = { metadata: { namespace: 'ns', name: 'vm', uid: 'u1' }, spec: {} };
  const recorded: string[] = [];
  const events: EventRecorder = {
    record: (_v, _t, reason, message) => void recorded.push(`${reason}: ${message}`),
    flush: async () => {},
  };
  const metrics = createMetrics({ version: 'test', processMetrics: false });
  const tracker = new ProvisioningTracker({
    records,
    vmiOf: () => vmi,
    events,
    metrics,
    logger: pino({ level: 'silent' }),
  });
  const entry = { namespace: 'ns', name: 'vm', uid: 'u1', seed: undefined as never };
  let at = t0 + 5_000;
  for (const e of fixture('boot-scripts-user-fails.json')) assert.ok(tracker.report(entry, e, new Date((at += 10))));
  const first = tracker.status(r, at)!;
  assert.equal(first.state, 'failed');
  assert.equal(first.boot, 1);

  at += EVENT_MIN_INTERVAL_MS + 60_000;
  const secondFrom = at + 10;
  for (const e of BOOT) assert.ok(tracker.report(entry, e, new Date((at += 10))));
  const second = tracker.status(r, at)!;
  assert.equal(second.state, 'succeeded');
  assert.equal(second.boot, 2);
  assert.equal(second.result, 'SUCCESS');
  assert.equal(second.failure, undefined, "boot 1's failure is not carried over");
  assert.equal(second.firstEventAt, new Date(secondFrom).toISOString());
  assert.equal(second.seconds, (at - secondFrom) / 1000, 'timed from its own first event, not from the VMI first seen');
  assert.deepEqual(
    second.stages.map((s) => s.name),
    ['init-local', 'init-network', 'modules-config', 'modules-final'],
  );
  for (const stage of second.stages) {
    assert.ok(Date.parse(stage.startedAt ?? stage.finishedAt!) >= secondFrom, stage.name);
    for (const m of stage.modules) assert.notEqual(m.result, 'FAIL', m.name);
  }
  assert.equal(recorded.length, 2);
  assert.match(recorded[0], /^ProvisioningFailed: .*\(boot 1, finished .* after the VMI was first seen\)$/);
  assert.match(recorded[1], /^ProvisioningSucceeded: .* after its first reported event \(boot 2\)$/);
  // The provisioning histogram is the first boot's (VMI seen -> done) only.
  const samples = parseExposition(await metrics.registry.metrics());
  assert.equal(sampleValue(samples, 'vmseed_provisioning_seconds_count', { result: 'fail' }), 1);
  assert.equal(sampleValue(samples, 'vmseed_provisioning_seconds_count', { result: 'success' }) ?? 0, 0);
});
