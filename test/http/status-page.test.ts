import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import {
  CONTENT_SECURITY_POLICY,
  STYLE,
  STYLE_HASH,
  parseStateFilter,
  projectSnapshot,
  renderNotFoundPage,
  renderStatusPage,
  renderVmiPage,
  stateCounts,
  statusJson,
} from '../../src/http/status-page.ts';
import { esc } from '../../src/http/html.ts';
import { sampleSnapshot, vmi } from '../support/fake-status.ts';

const now = new Date('2026-11-22T03:00:00.000Z');
const EVIL = `<script>alert("x")</script><img src=x onerror=alert(1)>'&`;

function rowsOf(html: string): string[] {
  return [...html.matchAll(/<tr class="vmi r-(\w+)" data-state="\w+">/g)].map((m) => m[1]);
}

test('esc escapes the five HTML-significant characters', () => {
  assert.equal(esc(`<a href="x" title='y'>&</a>`), '&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;&lt;/a&gt;');
  assert.equal(esc(undefined), '');
  assert.equal(esc(42), '42');
});

test('every user-controlled string is escaped on the list page', () => {
  const s = sampleSnapshot();
  s.nodeName = EVIL;
  s.config = { [EVIL]: EVIL };
  s.watch.lastError = EVIL;
  s.vmis = [
    vmi({
      namespace: EVIL,
      name: EVIL,
      state: 'error',
      imagePath: EVIL,
      contentHash: EVIL,
      lastError: { code: 'INTERNAL', message: EVIL, field: EVIL, at: EVIL },
      warnings: [{ code: 'USERDATA_NO_HEADER', message: EVIL, at: EVIL }],
      injection: {
        domain: EVIL,
        targetDev: EVIL,
        bus: 'virtio',
        flags: [EVIL],
        domainState: 'running',
        seededAfterBoot: true,
        resumed: false,
        at: EVIL,
      },
    }),
  ];
  const html = renderStatusPage(s, { now, refreshSeconds: 10 });
  assert.ok(!html.includes('<script'), 'no script element');
  assert.ok(!html.includes('<img'), 'no injected element');
  // Attribute values are all double-quoted and esc() escapes '"', so with
  // them blanked out any onerror= left would sit in a real tag.
  assert.ok(!/<[a-z][^>]*\sonerror=/i.test(html.replace(/"[^"]*"/g, '""')), 'no live event-handler attribute');
  assert.ok(html.includes('&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;'));
  // The detail link encodes the name as a URL and escapes it as an attribute.
  assert.ok(html.includes(`href="/status/${esc(encodeURIComponent(EVIL))}/`));
});

test('every user-controlled string is escaped on the detail and 404 pages', () => {
  const s = sampleSnapshot();
  const rec = vmi({
    namespace: EVIL,
    name: EVIL,
    state: 'ready',
    files: [{ path: EVIL, size: 1 }],
    lastFetch: { [EVIL]: EVIL },
  });
  for (const html of [renderVmiPage(s, rec, { now }), renderNotFoundPage(`no VMI ${EVIL}`)]) {
    assert.ok(!html.includes('<script'));
    assert.ok(!html.includes('<img'));
    assert.ok(html.includes('&lt;script&gt;'));
  }
});

test('counts per state and state filter', () => {
  const s = sampleSnapshot();
  assert.deepEqual(stateCounts(s.vmis), { error: 1, warning: 1, pending: 1, ready: 1, skipped: 1 });
  const all = renderStatusPage(s, { now });
  assert.deepEqual(rowsOf(all), ['error', 'warning', 'pending', 'ready', 'skipped'], 'errors sort first');
  const errors = renderStatusPage(s, { now, filter: 'error' });
  assert.deepEqual(rowsOf(errors), ['error']);
  assert.match(errors, /<a href="\/status\?state=error" class="s-error current"/);
  assert.match(errors, /SECRET_NOT_FOUND/);
  assert.match(errors, /Secret tenant-b\/db-userdata referenced by secretRef does not exist/);
  const none = renderStatusPage(
    { ...s, vmis: s.vmis.filter((v) => v.state !== 'skipped') },
    { now, filter: 'skipped' },
  );
  assert.deepEqual(rowsOf(none), []);
  assert.match(none, /no VMIs in state skipped/);
  assert.match(renderStatusPage({ ...s, vmis: [] }, { now }), /no VMIs on this node/);
});

test('parseStateFilter accepts the five states only', () => {
  assert.equal(parseStateFilter('error'), 'error');
  assert.equal(parseStateFilter('ready'), 'ready');
  assert.equal(parseStateFilter('ERROR'), undefined);
  assert.equal(parseStateFilter('<x>'), undefined);
  assert.equal(parseStateFilter(null), undefined);
});

test('a row shows hash shortened with the full hash in the title, sizes, times, injection and seeded-after-boot', () => {
  const html = renderStatusPage(sampleSnapshot(), { now });
  const full = 'a3f1c2d4e5b60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00';
  assert.ok(html.includes(`title="${full}">a3f1c2d4e5b6…</span>`));
  assert.ok(
    html.includes('/<wbr>var/<wbr>lib/<wbr>vmseed/<wbr>images/<wbr>default_web-1.iso'),
    'paths wrap at slashes',
  );
  assert.ok(html.includes('36 KiB'));
  assert.ok(html.includes('3.42 ms'));
  assert.ok(html.includes('2026-11-22 02:58:00Z'));
  assert.ok(html.includes('2m ago'));
  assert.ok(html.includes('<span class="clamp" title="default_web-1">default_web-1</span> → sdz'));
  assert.ok(html.includes('--live --config'));
  assert.match(html, /the guest may have booted without its seed">yes</);
});

test('the page refreshes itself by meta refresh (keeps the query string) and carries no script', () => {
  const html = renderStatusPage(sampleSnapshot(), { now, filter: 'error', refreshSeconds: 7 });
  assert.match(html, /<meta http-equiv="refresh" content="7">/);
  assert.ok(!/<script/i.test(html));
  assert.ok(!/ style="/i.test(html), 'no inline style attributes (blocked by CSP)');
  assert.ok(!/(src|href)="https?:/i.test(html), 'no external assets');
});

test('the CSP allows exactly the inline stylesheet by hash', () => {
  assert.equal(STYLE_HASH, `sha256-${createHash('sha256').update(STYLE).digest('base64')}`);
  assert.ok(CONTENT_SECURITY_POLICY.includes(`style-src '${STYLE_HASH}'`));
  assert.ok(CONTENT_SECURITY_POLICY.includes("default-src 'none'"));
  assert.ok(!CONTENT_SECURITY_POLICY.includes('unsafe-inline'));
  const html = renderStatusPage(sampleSnapshot(), { now });
  assert.ok(html.includes(`<style>${STYLE}</style>`));
});

test('detail page lists files and sizes', () => {
  const s = sampleSnapshot();
  const html = renderVmiPage(s, s.vmis[0], { now });
  for (const f of ['meta-data', 'user-data', 'network-config']) assert.ok(html.includes(`>${f}</td>`));
  assert.ok(html.includes('912 B'));
  assert.ok(
    html.includes('a3f1c2d4e5b60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00'),
    'full hash on the detail page',
  );
});

test('projection keeps declared fields only', () => {
  const s = sampleSnapshot() as any;
  s.extra = 'x-snapshot';
  s.vmis[0].userData = 'x-vmi';
  s.vmis[0].files[0].content = 'x-file';
  s.vmis[0].injection.xml = 'x-inj';
  s.vmis[1].lastError.cause = 'x-cause';
  s.watch.token = 'x-watch';
  s.config.nested = { a: 'x-config' };
  const text = JSON.stringify(projectSnapshot(s)) + JSON.stringify(statusJson(s, undefined, now));
  assert.ok(!/x-(snapshot|vmi|file|inj|cause|watch|config)/.test(text), text);
  assert.equal(projectSnapshot(s).vmis[0].files?.[0].path, 'meta-data');
});

test('statusJson narrows VMIs to the filter but counts all', () => {
  const j = statusJson(sampleSnapshot(), 'error', now);
  assert.equal(j.vmis.length, 1);
  assert.equal(j.vmis[0].name, 'db-0');
  assert.equal(j.counts.ready, 1);
  assert.equal(j.filter, 'error');
});

test('libvirt connections: projected field by field, escaped, cut connections flagged', () => {
  const s = sampleSnapshot();
  const connection = {
    uri: 'qemu+unix:///session?socket=/pods/<b>x</b>/sock',
    connected: false,
    watched: true,
    eventsReceived: 12,
    eventsDropped: 3,
    eventsCoalesced: 0,
    eventNamesTooLong: 1,
    cachedDomains: 1,
    cacheBytes: 10,
    bufferedBytes: 0,
    cuts: { 'slow-frame': 2 },
    lastCut: { reason: 'slow-frame', message: 'frame of 4194304 bytes not complete after 10 s: daemon too slow' },
    backoffMs: 4000,
    secret: 'never shown',
  };
  s.libvirt = { memoryBudget: { limit: 32 << 20, used: 1024 }, connections: [connection] };
  const html = renderStatusPage(s, { now: new Date() });
  assert.match(html, /id="libvirt" data-cut="true"/);
  assert.match(html, /slow-frame ×2/);
  assert.match(html, /daemon too slow/);
  assert.ok(html.includes('&lt;b&gt;x&lt;/b&gt;') && !html.includes('<b>x</b>'));
  assert.ok(!html.includes('never shown'));
  const json = statusJson(s, undefined, new Date());
  assert.equal(json.libvirt?.connections[0].eventsDropped, 3);
  assert.ok(!JSON.stringify(json).includes('never shown'));
  // No connection cut: no badge.
  s.libvirt = { memoryBudget: { limit: 1, used: 0 }, connections: [{ ...connection, cuts: {}, lastCut: undefined }] };
  assert.match(renderStatusPage(s, { now: new Date() }), /id="libvirt" data-cut="false"/);
});
