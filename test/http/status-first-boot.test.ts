// The first-boot facts on /status, the VMI's page and /status.json: the
// margin and the read when observed, "not seen" when not, and nothing a
// record smuggles in beyond the known fields.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderStatusPage, renderVmiPage, statusJson } from '../../src/http/status-page.ts';
import type { VmiStatusRecord } from '../../src/status/snapshot.ts';
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

test('NoCloud over HTTP: the first fetch of each file is kept, the last one follows', async () => {
  const { StatusStore } = await import('../../src/agent/status-store.ts');
  const s = new StatusStore({
    version: 't',
    nodeName: 'n',
    stateDir: '/tmp',
    config: {},
    watch: () => ({ mode: 'local', synced: true, connected: true, stale: false, restarts: 0 }),
    queue: () => ({ depth: 0, inFlight: 0 }),
    servedOverHttp: true,
    now: () => now,
  });
  s.update('ns/a', 'ua', { state: 'ready', datasource: 'nocloud' });
  s.recordFetch('ns/a', 'ua', 'meta-data', new Date('2026-11-22T02:59:01.000Z'));
  s.recordFetch('ns/a', 'ua', 'meta-data', new Date('2026-11-22T02:59:30.000Z'));
  s.recordFetch('ns/a', 'other', 'user-data', new Date('2026-11-22T02:59:31.000Z'));
  const json = statusJson(s.snapshot(), undefined, now) as { vmis: VmiStatusRecord[] };
  assert.deepEqual(json.vmis[0].firstFetch, { 'meta-data': '2026-11-22T02:59:01.000Z' });
  assert.deepEqual(json.vmis[0].lastFetch, { 'meta-data': '2026-11-22T02:59:30.000Z' });
  const page = renderVmiPage(s.snapshot(), s.snapshot().vmis[0], { now });
  assert.match(
    page,
    /the guest fetched meta-data at [^<]*<span class="muted">[^<]*<\/span><br><span class="muted">first at /,
  );
});
