// The status page in real headless Chromium: renders under its own CSP with
// no console errors, shows every VMI (one in error, with its message), the
// state filter works by clicking, the detail page opens, 200 VMIs with long
// names fit 1280 px, the filter box narrows the rows as one types and, with
// JavaScript off, by submitting; screenshots land in test-artifacts/ for a
// human to look at. One browser for the whole file: launches are slow.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import { FakeStatusSource, sampleSnapshot, vmi } from '../support/fake-status.ts';
import type { AgentStatusSnapshot, VmiStatusRecord } from '../../src/status/snapshot.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { launchBrowser } from '../support/browser.ts';

const ARTIFACTS = join(import.meta.dirname, '..', '..', 'test-artifacts');

let browser: Awaited<ReturnType<typeof launchBrowser>>;
before(async () => {
  browser = await launchBrowser();
});
after(() => browser.close());

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
  const page = await browser.context.newPage();
  try {
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
    // The script reloads the page (meta refresh only without JavaScript).
    assert.equal(await page.locator('body').getAttribute('data-refresh'), '10');
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
    await page.close();
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

test('the page refreshes itself and keeps the state filter and the typed query', { timeout: 60_000 }, async () => {
  const source = new FakeStatusSource();
  const { logger } = captureLogger('warn');
  const srv = await startHttpServer({
    listen: '127.0.0.1:0',
    metrics: createMetrics({ version: 't', processMetrics: false }),
    status: source,
    logger,
    refreshSeconds: 1,
  });
  const page = await browser.context.newPage();
  try {
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
    // What is typed in the filter box survives the reloads, focus included.
    // A reload already under way when typing starts loses it: type again.
    const read = `[document.getElementById('filter-q').value, document.activeElement.id, location.search,
      Array.from(document.querySelectorAll('tr.vmi:not([hidden]) a.name'), (a) => a.textContent)]`;
    let kept: unknown;
    for (let attempt = 1; attempt <= 3 && (kept as string[] | undefined)?.[0] !== 'late'; attempt++) {
      await acrossRefresh(() => page.locator('#filter-q').fill('late'));
      await page.waitForEvent('load');
      kept = await acrossRefresh(() => page.evaluate(read));
    }
    assert.deepEqual(kept, ['late', 'filter-q', '?state=error&q=late', ['late-failure']]);
    assert.deepEqual(problems, []);
  } finally {
    await page.close();
    await srv.close();
  }
});

// 200 VMIs in every state; every third with a 63-character name and
// namespace (the longest Kubernetes allows), errors with long messages.
function manyVmis(): AgentStatusSnapshot {
  const at = '2026-11-22T02:59:00.000Z';
  const s = sampleSnapshot();
  s.vmis = Array.from({ length: 200 }, (_, i): VmiStatusRecord => {
    const long = (prefix: string) => (i % 3 === 0 ? `${prefix}-${'x'.repeat(63)}`.slice(0, 63) : prefix);
    const namespace = long(`tenant-${i % 7}`);
    const name = long(`vm-${i}`);
    const seeded = {
      namespace,
      name,
      datasource: 'nocloud' as const,
      imagePath: `/var/lib/vmseed/images/${namespace}_${name}.iso`,
      imageBytes: 36864,
      contentHash: 'a3f1c2d4e5b60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00',
      generatedAt: at,
      generationSeconds: 0.0042,
      injection: {
        domain: `${namespace}_${name}`,
        targetDev: 'sdz',
        bus: 'scsi' as const,
        flags: ['--live', '--config'],
        domainState: 'running' as const,
        seededAfterBoot: i % 4 === 0,
        resumed: false,
        at,
      },
    };
    switch (i % 5) {
      case 0:
        return vmi({ ...seeded, state: 'ready' });
      case 1:
        return vmi({
          namespace,
          name,
          state: 'pending',
          lastError: { code: 'SEED_GATE_WAITING', message: 'waiting for the seed gate on the VMI to open', at },
        });
      case 2:
        return vmi({
          namespace,
          name,
          state: 'error',
          retries: 3,
          lastError: {
            code: 'SECRET_NOT_FOUND',
            field: 'spec.volumes[0].cloudInitNoCloud.secretRef',
            message: `Secret ${namespace}/${name}-userdata referenced by secretRef does not exist; create it or fix secretRef.name. ${'A long message wraps in its cell instead of widening the row. '.repeat(3)}`,
            at,
          },
        });
      case 3:
        return vmi({ namespace, name, state: 'skipped' });
      default:
        return vmi({
          ...seeded,
          state: 'warning',
          warnings: [{ code: 'USERDATA_NO_HEADER', message: 'user-data does not start with #cloud-config', at }],
        });
    }
  });
  return s;
}

const VISIBLE_ROWS = `Array.from(document.querySelectorAll('tr.vmi:not([hidden])'),
  (tr) => tr.querySelector('.ns').textContent + '/' + tr.querySelector('a.name').textContent).sort()`;

// Wider than the viewport anywhere: the page, a row's last cell, or a cell
// whose content is wider than the cell.
interface Layout {
  scrollWidth: number;
  lastCellRight: number;
  overflowingCells: number;
}
const LAYOUT = `({
  scrollWidth: document.documentElement.scrollWidth,
  lastCellRight: Math.max(...Array.from(document.querySelectorAll('tr.vmi > td:last-child'), (td) => td.getBoundingClientRect().right)),
  overflowingCells: Array.from(document.querySelectorAll('tr.vmi > td')).filter((td) => td.scrollWidth > td.clientWidth).length,
})`;

test(
  '200 VMIs fit 1280 px; the filter box narrows the rows as one types and, without JavaScript, on submit',
  { timeout: 120_000 },
  async () => {
    const snapshot = manyVmis();
    const key = (v: VmiStatusRecord) => `${v.namespace}/${v.name}`;
    const expect = (keep: (v: VmiStatusRecord) => boolean) => snapshot.vmis.filter(keep).map(key).sort();
    const { logger } = captureLogger('warn');
    const srv = await startHttpServer({
      listen: '127.0.0.1:0',
      metrics: createMetrics({ version: 't', processMetrics: false }),
      status: new FakeStatusSource(snapshot),
      logger,
      refreshSeconds: 600,
      now: () => new Date('2026-11-22T03:00:00.000Z'),
    });
    const page = await browser.context.newPage();
    const noScript = await browser.context.newPage();
    try {
      const problems: string[] = [];
      for (const p of [page, noScript]) {
        p.on('console', (m) => {
          if (m.type() === 'error' || m.type() === 'warning') problems.push(`${m.type()}: ${m.text()}`);
        });
        p.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
        p.on('dialog', (d) => problems.push(`dialog: ${d.message()}`));
        await p.setViewportSize({ width: 1280, height: 800 });
      }
      await (
        await browser.context.newCDPSession(noScript)
      ).send('Emulation.setScriptExecutionDisabled', { value: true });

      await page.goto(`${srv.url}/status`);
      assert.equal(await page.locator('tr.vmi').count(), 200);
      const layout = await page.evaluate<Layout>(LAYOUT);
      assert.ok(layout.scrollWidth <= 1280, `scrollWidth ${layout.scrollWidth}`);
      assert.ok(layout.lastCellRight <= 1280, `last cell ends at ${layout.lastCellRight}`);
      assert.equal(layout.overflowingCells, 0);
      await mkdir(ARTIFACTS, { recursive: true });
      await page.screenshot({ path: join(ARTIFACTS, 'status-1280.png') });

      // As one types: the rows narrow, the count follows, the URL and the
      // state links carry the query (so a reload keeps it).
      const box = page.locator('#filter-q');
      const cases: Array<[string, string[]]> = [
        ['vm-17', expect((v) => v.name.includes('vm-17'))],
        ['ns:tenant-3', expect((v) => v.namespace.includes('tenant-3'))],
        ['state:skipped', expect((v) => v.state === 'skipped')],
        ['code:seed_gate', expect((v) => v.lastError?.code === 'SEED_GATE_WAITING')],
      ];
      // Key by key for the first: each keystroke filters.
      await box.pressSequentially(cases[0][0]);
      assert.deepEqual(await page.evaluate(VISIBLE_ROWS), cases[0][1], cases[0][0]);
      for (const [query, rows] of cases.slice(1)) {
        await box.fill(query);
        assert.deepEqual(await page.evaluate(VISIBLE_ROWS), rows, query);
      }
      const combined = 'tenant-2 state:error';
      const both = expect((v) => v.namespace.includes('tenant-2') && v.state === 'error');
      await box.fill(combined);
      assert.deepEqual(await page.evaluate(VISIBLE_ROWS), both);
      assert.equal(await page.locator('#filter-count').textContent(), `${both.length} of 200 shown`);
      assert.match(page.url(), /\/status\?q=tenant-2\+state%3Aerror$/);
      assert.match(
        (await page.locator('ul.counts a[data-state="ready"]').getAttribute('href')) ?? '',
        /state=ready&q=tenant-2/,
      );
      assert.ok(await page.locator('#filter-empty').isHidden());
      assert.ok(await page.locator('tr.vmi[hidden]').first().isHidden(), 'a hidden row is not displayed');
      // A hostile query is text: shown as typed, matching nothing, running nothing.
      const evil = `"><script>alert(1)</script><img src=x onerror=alert(2)>`;
      await box.fill(evil);
      assert.ok(await page.locator('#filter-empty').isVisible());
      assert.equal(await page.locator('#filter-empty-q').textContent(), evil);
      await box.fill('');
      assert.equal(await page.locator('tr.vmi:not([hidden])').count(), 200);

      // JavaScript off: the page renders whole (meta refresh is live), and
      // the form filters on the server to the same rows.
      await noScript.goto(`${srv.url}/status`);
      assert.equal(await noScript.locator('tr.vmi').count(), 200);
      assert.equal(await noScript.locator('noscript meta[http-equiv="refresh"]').count(), 1, 'scripting is off');
      assert.equal(await page.locator('noscript meta[http-equiv="refresh"]').count(), 0, 'scripting is on');
      assert.ok((await noScript.evaluate<Layout>(LAYOUT)).scrollWidth <= 1280);
      await noScript.locator('#filter-q').fill(combined);
      await Promise.all([noScript.waitForURL(/\?q=/), noScript.locator('#filter-q').press('Enter')]);
      assert.deepEqual(await noScript.evaluate(VISIBLE_ROWS), both);
      assert.ok(await noScript.locator('tr.vmi[hidden]').first().isHidden(), 'a hidden row is not displayed');
      assert.equal(await noScript.locator('#filter-q').inputValue(), combined);
      assert.equal(await noScript.locator('#filter-count').textContent(), `${both.length} of 200 shown`);
      await noScript.locator('#filter-q').fill(evil);
      await Promise.all([noScript.waitForURL(/\?q=%22/), noScript.locator('#filter-q').press('Enter')]);
      assert.equal(await noScript.locator('#filter-q').inputValue(), evil);
      assert.equal(await noScript.locator('#filter-empty-q').textContent(), evil);
      assert.ok(await noScript.locator('#filter-empty').isVisible());
      assert.equal(await noScript.locator('main img, main script').count(), 0);
      assert.deepEqual(problems, []);
    } finally {
      await page.close();
      await noScript.close();
      await srv.close();
    }
  },
);
