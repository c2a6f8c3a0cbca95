// The status page's filter box on the server: ?q= hides the rows it does not
// match (name, namespace, state, code), the query is plain text, capped and
// escaped where it is echoed, and no match says so. The browser side is in
// status-browser.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { Script } from 'node:vm';
import { CONTENT_SECURITY_POLICY, renderStatusPage } from '../../src/http/status-page.ts';
import {
  FILTER_SCRIPT,
  FILTER_SCRIPT_HASH,
  MAX_QUERY_LENGTH,
  matchesQuery,
  parseQuery,
} from '../../src/http/status-filter.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import { FakeStatusSource, sampleSnapshot, vmi } from '../support/fake-status.ts';
import { captureLogger } from '../support/capture-logger.ts';

const now = new Date('2026-11-22T03:00:00.000Z');
const at = '2026-11-22T02:59:00.000Z';

function snapshot() {
  const s = sampleSnapshot();
  s.vmis = [
    vmi({ namespace: 'shop', name: 'web-1', state: 'ready' }),
    vmi({
      namespace: 'shop',
      name: 'web-2',
      state: 'pending',
      lastError: { code: 'SEED_GATE_WAITING', message: 'gate', at },
    }),
    vmi({
      namespace: 'billing',
      name: 'db-0',
      state: 'error',
      lastError: { code: 'SECRET_NOT_FOUND', message: 'no', at },
    }),
    vmi({
      namespace: 'billing',
      name: 'web-3',
      state: 'warning',
      warnings: [{ code: 'USERDATA_NO_HEADER', message: 'header', at }],
    }),
    vmi({ namespace: 'batch', name: 'cron-9', state: 'skipped' }),
  ];
  return s;
}

// The rows the page shows (not hidden), as namespace/name.
function shown(html: string): string[] {
  return [
    ...html.matchAll(
      /<tr class="vmi [^"]*" data-state="\w+"( hidden)?>[\s\S]*?<a class="name"[^>]*>([^<]*)<\/a><br><span class="ns">([^<]*)<\/span>/g,
    ),
  ]
    .filter((m) => m[1] === undefined)
    .map((m) => `${m[3]}/${m[2]}`);
}

const render = (query: string, filter?: 'error' | 'ready') =>
  renderStatusPage(snapshot(), { now, query: parseQuery(query), filter, clientFilter: true, refreshSeconds: 10 });

test('the query matches name, namespace, state and code, every term, any case', () => {
  assert.deepEqual(shown(render('')), ['billing/db-0', 'billing/web-3', 'shop/web-2', 'shop/web-1', 'batch/cron-9']);
  assert.deepEqual(shown(render('WEB')), ['billing/web-3', 'shop/web-2', 'shop/web-1'], 'name');
  assert.deepEqual(shown(render('name:db')), ['billing/db-0']);
  assert.deepEqual(shown(render('billing')), ['billing/db-0', 'billing/web-3'], 'namespace');
  assert.deepEqual(shown(render('ns:shop')), ['shop/web-2', 'shop/web-1']);
  assert.deepEqual(shown(render('state:pending')), ['shop/web-2'], 'state');
  assert.deepEqual(shown(render('skipped')), ['batch/cron-9']);
  assert.deepEqual(shown(render('code:secret')), ['billing/db-0'], 'code');
  assert.deepEqual(shown(render('USERDATA_NO_HEADER')), ['billing/web-3'], 'a warning code');
  assert.deepEqual(shown(render('SEED_GATE')), ['shop/web-2'], 'a pending row waiting on a code');
  assert.deepEqual(shown(render('  web   ns:billing ')), ['billing/web-3'], 'every term must match');
  // A prefix that is not a field is text, colon included.
  assert.deepEqual(shown(render('constructor:x')), []);
  // With the state filter: both apply, the form keeps the state.
  const both = render('billing', 'error');
  assert.deepEqual(shown(both), ['billing/db-0']);
  assert.match(both, /<input type="hidden" name="state" value="error">/);
});

test('the filter box echoes the query, the count and links carry it on, rows hidden not dropped', () => {
  const html = render('web ns:shop');
  assert.match(html, /<form class="filter" id="filter" method="get" action="\/status" aria-label="filter the VMIs">/);
  assert.match(html, /<input type="text" id="filter-q" name="q" value="web ns:shop" maxlength="200"/);
  assert.match(html, /<span class="muted" id="filter-count">2 of 5 shown<\/span>/);
  assert.match(html, /<a href="\/status\?state=error&amp;q=web\+ns%3Ashop" class="s-error"/);
  assert.match(html, /<a href="\/status\?q=web\+ns%3Ashop" class="s-all current"/);
  // Every row is there for the script to show again; the others are hidden.
  assert.equal([...html.matchAll(/<tr class="vmi /g)].length, 5);
  assert.equal([...html.matchAll(/<tr class="vmi [^>]* hidden>/g)].length, 3);
  assert.match(html, /<p class="empty" id="filter-empty" hidden>/);
});

test('no match: an empty-state line with the query and a way back', () => {
  const html = render('nothing-like-this');
  assert.deepEqual(shown(html), []);
  assert.match(html, /id="filter-count">0 of 5 shown/);
  assert.match(
    html,
    /<p class="empty" id="filter-empty">no VMIs match “<span id="filter-empty-q">nothing-like-this<\/span>” · <a href="\/status">clear the filter<\/a><\/p>/,
  );
  assert.match(
    render('zzz', 'error'),
    /no VMIs match “<span id="filter-empty-q">zzz<\/span>” in state error · <a href="\/status\?state=error">/,
  );
});

test('a hostile or over-long query is plain text: capped, control characters dropped, escaped where echoed', () => {
  const evil = `"><script>alert(1)</script><img src=x onerror=alert(2)>'&`;
  const html = render(evil);
  assert.ok(!html.includes('<script>alert'), 'no reflected script');
  assert.ok(!html.includes('<img'), 'no reflected element');
  assert.ok(!/<[a-z][^>]*\sonerror=/i.test(html.replace(/"[^"]*"/g, '""')), 'no live event-handler attribute');
  assert.ok(
    html.includes(
      `value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;&#39;&amp;"`,
    ),
  );
  assert.ok(html.includes('<span id="filter-empty-q">&quot;&gt;&lt;script&gt;'));
  // Exactly one script: the page's own.
  assert.equal([...html.matchAll(/<script/g)].length, 1);
  assert.ok(html.includes(`<script>${FILTER_SCRIPT}</script>`));

  const long = 'a'.repeat(10_000);
  assert.equal(parseQuery(long).length, MAX_QUERY_LENGTH);
  assert.equal([...render(long).matchAll(new RegExp(`a{${MAX_QUERY_LENGTH + 1}}`, 'g'))].length, 0, 'echo capped');
  assert.equal(parseQuery('a\u0000b\r\nc\u007f'), 'a b c ');
  assert.equal(parseQuery(null), '');
  // A surrogate pair cut at the cap is dropped whole.
  assert.equal(parseQuery('a'.repeat(MAX_QUERY_LENGTH - 1) + '😀'), 'a'.repeat(MAX_QUERY_LENGTH - 1));
  assert.equal(matchesQuery(parseQuery(long), snapshot().vmis[0]), false);
});

test('the script is allowed by its hash and the form by form-action self; without the script, meta refresh', () => {
  assert.equal(FILTER_SCRIPT_HASH, `sha256-${createHash('sha256').update(FILTER_SCRIPT).digest('base64')}`);
  assert.ok(CONTENT_SECURITY_POLICY.includes(`script-src '${FILTER_SCRIPT_HASH}'`));
  assert.ok(CONTENT_SECURITY_POLICY.includes("form-action 'self'"));
  assert.ok(!/unsafe-|script-src[^;]*(\*|'self'|https?:|data:)/.test(CONTENT_SECURITY_POLICY));
  // The embedded functions parse (the script is their source text).
  assert.doesNotThrow(() => new Script(FILTER_SCRIPT));
  // With the script, the script reloads (it keeps the typed query); without
  // JavaScript, meta refresh does.
  const html = render('web');
  assert.match(html, /<noscript><meta http-equiv="refresh" content="10"><\/noscript>/);
  assert.match(html, /<body data-refresh="10">/);
  const plain = renderStatusPage(snapshot(), { now, refreshSeconds: 10 });
  assert.ok(!plain.includes('<script') && !plain.includes('<noscript'));
  assert.match(plain, /<meta http-equiv="refresh" content="10">/);
});

test('GET /status?q= filters on the server', async () => {
  const { logger } = captureLogger('warn');
  const srv = await startHttpServer({
    listen: '127.0.0.1:0',
    metrics: createMetrics({ version: 't', processMetrics: false }),
    status: new FakeStatusSource(snapshot()),
    logger,
    now: () => now,
  });
  try {
    const res = await fetch(`${srv.url}/status?state=error&q=${encodeURIComponent('ns:billing <b>')}`);
    assert.equal(res.status, 200);
    const html = await res.text();
    assert.deepEqual(shown(html), []);
    assert.match(html, /value="ns:billing &lt;b&gt;"/);
    assert.deepEqual(shown(await (await fetch(`${srv.url}/status?q=code%3ASECRET`)).text()), ['billing/db-0']);
    assert.equal(res.headers.get('content-security-policy'), CONTENT_SECURITY_POLICY);
  } finally {
    await srv.close();
  }
});
