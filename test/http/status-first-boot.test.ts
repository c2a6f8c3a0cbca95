// The first-boot facts on /status, the VMI's page and /status.json: the
// margin and the read when observed, "not seen" when not, and nothing a
// record smuggles in beyond the known fields.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderStatusPage, renderVmiPage, statusJson } from '../../src/http/status-page.ts';
import type { VmiStatusRecord } from '../../src/status/types.ts';
import { sampleSnapshot } from '../support/fake-status.ts';

const now = new Date('2026-11-22T03:00:00.000Z');

function withFirstBoot(firstBoot: VmiStatusRecord['firstBoot']) {
  const s = sampleSnapshot();
  const rec = { ...s.vmis[0], firstBoot };
  s.vmis = [rec, ...s.vmis.slice(1)];
  return { s, rec };
}

test('read by the guest: margin and read time on the list, the VMI page and status.json', () => {
  const { s, rec } = withFirstBoot({
    domainStartedAt: '2026-11-22T02:59:00.000Z',
    attachedAt: '2026-11-22T02:59:00.012Z',
    attachAfterStartSeconds: 0.012,
    seedReadAt: '2026-11-22T02:59:03.500Z',
    readAfterStartSeconds: 3.5,
    readAfterAttachSeconds: 3.488,
    watch: 'read',
  });
  const list = renderStatusPage(s, { now, refreshSeconds: 10 });
  assert.match(list, /attached 12\.0 ms after start · read by guest 3\.50 s after start/);
  const page = renderVmiPage(s, rec, { now });
  assert.match(page, /<h2>First boot<\/h2>/);
  assert.match(page, /seed read by guest<\/th><td>[^<]*<span class="muted">\(3\.50 s after the start\)<\/span>/);
  const json = statusJson(s, undefined, now) as { vmis: VmiStatusRecord[] };
  assert.deepEqual(json.vmis.find((v) => v.uid === rec.uid)?.firstBoot, rec.firstBoot);
});

test('start not seen, still watching: said so, no margin invented; unknown fields dropped from JSON', () => {
  const { s, rec } = withFirstBoot({
    attachedAt: '2026-11-22T02:59:00.012Z',
    watch: 'polling',
    ...({ token: 'x' } as object),
  });
  const list = renderStatusPage(s, { now, refreshSeconds: 10 });
  assert.match(list, /start not seen · not read yet \(watching\)/);
  const page = renderVmiPage(s, rec, { now });
  assert.match(page, /domain started<\/th><td><span class="muted">not seen by this agent/);
  const json = statusJson(s, undefined, now) as { vmis: VmiStatusRecord[] };
  assert.deepEqual(json.vmis.find((v) => v.uid === rec.uid)?.firstBoot, {
    attachedAt: '2026-11-22T02:59:00.012Z',
    watch: 'polling',
  });
});
