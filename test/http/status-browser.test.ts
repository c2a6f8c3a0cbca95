// The status page in real headless Chromium: renders under its own CSP with
// no console errors, shows every VMI (one in error, with its message), the
// state filter works by clicking, the detail page opens, and a screenshot
// lands in test-artifacts/ for a human to look at.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import { FakeStatusSource } from '../support/fake-status.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { launchBrowser } from '../support/browser.ts';

const ARTIFACTS = join(import.meta.dirname, '..', '..', 'test-artifacts');

test('status page in headless Chromium', { timeout: 120_000 }, async () => {
  const source = new FakeStatusSource();
  const { logger } = captureLogger('warn');
  const srv = await startHttpServer({
    listen: '127.0.0.1:0',
    metrics: createMetrics({ version: 't', processMetrics: false }),
    status: source,
    logger,
    now: () => new Date('2026-11-22T03:00:00.000Z'),
  });
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const problems: string[] = [];
    page.on('console', (m) => {
      if (m.type() === 'error' || m.type() === 'warning') problems.push(`${m.type()}: ${m.text()}`);
    });
    page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
    page.on('requestfailed', (r) => problems.push(`requestfailed: ${r.url()}`));
    const requested: string[] = [];
    page.on('request', (r) => requested.push(r.url()));

    const res = await page.goto(`${srv.url}/status`);
    assert.equal(res?.status(), 200);
    assert.match(await page.title(), /\(1 error\) vmseed · node-a/);

    // Every VMI, errors first, the error message readable.
    const rows = page.locator('tr.vmi');
    assert.equal(await rows.count(), 5);
    assert.deepEqual(await rows.evaluateAll((els) => els.map((e) => e.getAttribute('data-state'))), [
      'error',
      'warning',
      'pending',
      'ready',
      'skipped',
    ]);
    const errorRow = page.locator('tr.vmi[data-state="error"]');
    assert.match(
      await errorRow.innerText(),
      /db-0[\s\S]*SECRET_NOT_FOUND[\s\S]*Secret tenant-b\/db-userdata referenced by secretRef does not exist/,
    );
    assert.ok(await errorRow.locator('.err').isVisible());

    // The stylesheet applied (CSP allowed it by hash): the error pill is red.
    const pillBg = await errorRow
      .locator('.state')
      .evaluate((e) => (globalThis as any).getComputedStyle(e).backgroundColor);
    assert.equal(pillBg, 'rgb(207, 34, 46)');
    // The chart is drawn.
    assert.equal(await page.locator('svg.chart circle.pt').count(), 7);
    // Counts per state at the top.
    assert.match(await page.locator('ul.counts').innerText(), /all\s*5[\s\S]*error\s*1[\s\S]*ready\s*1/);

    // Readable without scrolling sideways on an ordinary screen.
    assert.ok(
      await page.evaluate('document.documentElement.scrollWidth <= window.innerWidth'),
      'no horizontal overflow at 1500 px',
    );

    await mkdir(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, 'status.png'), fullPage: true });

    // Filter by clicking the error count.
    await Promise.all([
      page.waitForURL(/\/status\?state=error$/),
      page.locator('ul.counts a[data-state="error"]').click(),
    ]);
    assert.equal(await page.locator('tr.vmi').count(), 1);
    assert.equal(await page.locator('tr.vmi').getAttribute('data-state'), 'error');
    assert.equal(await page.locator('meta[http-equiv="refresh"]').getAttribute('content'), '10');
    await page.screenshot({ path: join(ARTIFACTS, 'status-error.png'), fullPage: true });

    // Another filter, and the page under it.
    await Promise.all([page.waitForURL(/state=skipped/), page.locator('ul.counts a[data-state="skipped"]').click()]);
    assert.equal(await page.locator('tr.vmi').count(), 1);

    // Detail page from the table.
    await page.goto(`${srv.url}/status`);
    await Promise.all([
      page.waitForURL(/\/status\/default\/web-1$/),
      page.locator('a.name', { hasText: 'web-1' }).click(),
    ]);
    const detail = await page.locator('main').innerText();
    assert.match(detail, /a3f1c2d4e5b60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00/);
    assert.match(detail, /meta-data[\s\S]*user-data[\s\S]*network-config/);
    await page.screenshot({ path: join(ARTIFACTS, 'status-detail.png'), fullPage: true });

    assert.deepEqual(problems, []);
    // Unknown VMI: a 404 page; Chromium logs the 404 status itself, nothing else.
    const missing = await page.goto(`${srv.url}/status/default/gone`);
    assert.equal(missing?.status(), 404);
    assert.match(await page.locator('main').innerText(), /no VMI default\/gone on this node/);
    assert.deepEqual(
      problems.filter((p) => !/404 \(Not Found\)/.test(p)),
      [],
    );
    // Nothing was loaded from anywhere but the agent (and the data: favicon).
    assert.deepEqual(
      requested.filter((u) => !u.startsWith(srv.url) && !u.startsWith('data:')),
      [],
    );
  } finally {
    await browser.close();
    await srv.close();
  }
});

// The page reloads itself every second: a read that lands on the reload
// loses its document; read again from the reloaded one.
async function acrossRefresh<T>(read: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await read();
    } catch (e) {
      if (attempt >= 5 || !/Execution context was destroyed/.test(String(e))) throw e;
    }
  }
}

test('the page refreshes itself and keeps the state filter', { timeout: 60_000 }, async () => {
  const source = new FakeStatusSource();
  const { logger } = captureLogger('warn');
  const srv = await startHttpServer({
    listen: '127.0.0.1:0',
    metrics: createMetrics({ version: 't', processMetrics: false }),
    status: source,
    logger,
    refreshSeconds: 1,
  });
  const browser = await launchBrowser();
  try {
    const page = await browser.context.newPage();
    const problems: string[] = [];
    page.on('console', (m) => {
      if (m.type() === 'error') problems.push(m.text());
    });
    await page.goto(`${srv.url}/status?state=error`);
    assert.deepEqual(await acrossRefresh(() => page.locator('tr.vmi a.name').allInnerTexts()), ['db-0']);
    // A second VMI fails; without any action in the browser it shows up,
    // and the ready ones stay filtered out.
    source.current.vmis.push({
      namespace: 'default',
      name: 'late-failure',
      uid: 'u2',
      state: 'error',
      warnings: [],
      retries: 1,
      lastError: {
        code: 'VIRSH_TIMEOUT',
        message: 'virsh attach-device timed out after 30 s',
        at: '2026-11-22T03:00:00Z',
      },
    });
    await page.locator('tr.vmi a.name', { hasText: 'late-failure' }).waitFor({ timeout: 10_000 });
    assert.match(page.url(), /\/status\?state=error$/);
    assert.deepEqual(
      await acrossRefresh(() =>
        page.locator('tr.vmi').evaluateAll((els) => els.map((e) => e.getAttribute('data-state'))),
      ),
      ['error', 'error'],
    );
    assert.deepEqual(problems, []);
  } finally {
    await browser.close();
    await srv.close();
  }
});
