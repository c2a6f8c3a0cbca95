import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { renderStatusPage, statusJson } from '../../src/http/status-page.ts';
import { StatusStore } from '../../src/agent/status-store.ts';
import type { RedirectStatus } from '../../src/status/snapshot.ts';
import { sampleSnapshot } from '../support/fake-status.ts';

const now = new Date('2026-11-22T03:00:00.000Z');
const EVIL = `<script>alert("x")</script><img src=x onerror=alert(1)>'&`;

function panel(html: string): string | undefined {
  return html.match(/<section class="panel" id="redirect"[\s\S]*?<\/section>/)?.[0];
}

test('no redirect panel and no redirect key without --redirect-status-url', () => {
  const s = sampleSnapshot();
  assert.equal(panel(renderStatusPage(s, { now })), undefined);
  assert.equal('redirect' in statusJson(s, undefined, now), false);
});

test('the redirect panel says in place / missing (escaped reason) / unreachable, and since when', () => {
  const s = sampleSnapshot();
  s.redirect = { state: 'in-place', since: '2026-11-22T02:50:00.000Z', checkedAt: '2026-11-22T02:59:58.000Z' };
  let p = panel(renderStatusPage(s, { now }))!;
  assert.match(p, /data-redirect="in-place"/);
  assert.match(p, /b-ok">in place</);
  assert.match(p, /<tr><th>since<\/th><td>[^<]*2026[^<]*<span class="muted">10m ago<\/span>/);
  assert.doesNotMatch(p, /reason/);

  s.redirect = {
    state: 'missing',
    reason: `apply-failed: ${EVIL}`,
    since: '2026-11-22T02:59:00.000Z',
    checkedAt: '2026-11-22T02:59:58.000Z',
  };
  const html = renderStatusPage(s, { now });
  p = panel(html)!;
  assert.match(p, /b-bad">missing</);
  assert.ok(
    p.includes(
      'apply-failed: &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&#39;&amp;',
    ),
    p,
  );
  assert.equal(html.includes('<script>alert'), false);

  s.redirect = {
    state: 'unreachable',
    reason: 'ECONNREFUSED',
    since: '2026-11-22T02:58:00.000Z',
    checkedAt: '2026-11-22T02:59:58.000Z',
  };
  p = panel(renderStatusPage(s, { now }))!;
  assert.match(p, /b-bad">unreachable</);
  assert.match(p, /ECONNREFUSED/);
});

test('/status.json carries the redirect, projected field by field', () => {
  const s = sampleSnapshot();
  s.redirect = {
    state: 'missing',
    reason: 'missing',
    since: '2026-11-22T02:59:00.000Z',
    checkedAt: '2026-11-22T02:59:58.000Z',
    extra: 'leak',
  } as RedirectStatus;
  const j = statusJson(s, undefined, now);
  assert.deepEqual(j.redirect, {
    state: 'missing',
    reason: 'missing',
    since: '2026-11-22T02:59:00.000Z',
    checkedAt: '2026-11-22T02:59:58.000Z',
  });
  s.redirect = { state: 'bogus', since: 'a', checkedAt: 'b' } as unknown as RedirectStatus;
  assert.equal(statusJson(s, undefined, now).redirect!.state, 'unreachable');
});

test('the status store puts its redirect source into the snapshot', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-redirect-'));
  try {
    const store = new StatusStore({
      version: 't',
      nodeName: 'n',
      stateDir: dir,
      config: {},
      watch: () => ({ mode: 'local', synced: true, connected: true, stale: false, restarts: 0 }),
      queue: () => ({ depth: 0, inFlight: 0 }),
    });
    assert.equal(store.snapshot().redirect, undefined);
    let current: RedirectStatus | undefined;
    store.setRedirectSource(() => current);
    assert.equal(store.snapshot().redirect, undefined, 'not polled yet: no claim either way');
    current = { state: 'in-place', since: 'x', checkedAt: 'y' };
    assert.deepEqual(store.snapshot().redirect, current);
    // The agent's own readiness does not depend on it.
    current = { state: 'missing', reason: 'stopped', since: 'x', checkedAt: 'y' };
    assert.equal((await store.readiness()).ready, true);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
