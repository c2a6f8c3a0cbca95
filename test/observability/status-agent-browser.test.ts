// The status page of a RUNNING agent (the CLI in local mode on a copy of
// examples/) in headless Chromium: no console errors, every example VMI
// (the broken one with its code and message), the state filter by
// clicking, a detail page with the seed's files and sizes that match the
// ISO on disk, /status.json agreeing with the page, and /metrics from the
// same process. Screenshot: test-artifacts/status-agent.png.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { cp, mkdir, readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { parseManifests } from '../../src/agent/local/manifests.ts';
import { tempDir, waitFor } from '../support/agent-harness.ts';
import { launchBrowser } from '../support/browser.ts';
import { parseExposition, promtoolCheck, sampleValue } from '../support/promtool.ts';

const ROOT = new URL('../../', import.meta.url).pathname;
const ARTIFACTS = join(ROOT, 'test-artifacts');

interface JsonVmi {
  namespace: string;
  name: string;
  state: string;
  datasource?: string;
  imagePath?: string;
  imageBytes?: number;
  contentHash?: string;
  files?: Array<{ path: string; size: number }>;
  lastError?: { code: string; message: string };
}

test(
  'status page of a running local-mode agent on examples/, in headless Chromium',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-obs-local-');
    const manifests = join(dir.path, 'examples');
    const state = join(dir.path, 'seeds');
    await cp(join(ROOT, 'examples'), manifests, { recursive: true });
    const expected: string[] = [];
    for (const f of (await readdir(manifests)).filter((f) => f.endsWith('.yaml')).sort()) {
      for (const v of parseManifests(await readFile(join(manifests, f), 'utf8'), f).vmis)
        expected.push(`${v.metadata.namespace}/${v.metadata.name}`);
    }
    expected.sort();
    assert.ok(expected.length >= 5, `examples hold ${expected.length} VMIs`);

    const child = spawn(
      process.execPath,
      [
        join(ROOT, 'src/main.ts'),
        'agent',
        '--local',
        manifests,
        '--state-dir',
        state,
        '--listen',
        '127.0.0.1:0',
        '--log-level',
        'debug',
      ],
      {
        cwd: dir.path,
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let log = '';
    child.stdout.on('data', (d) => (log += d));
    child.stderr.on('data', (d) => (log += d));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    const browser = await launchBrowser();
    t.after(async () => {
      await browser.close();
      if (child.exitCode === null) child.kill('SIGKILL');
      await dir.remove();
    });

    const url = await waitFor('listen url', () => /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(log)?.[1], 60_000);
    const statusJson = async () =>
      (await (await fetch(`${url}/status.json`)).json()) as {
        nodeName: string;
        watch: { mode: string; synced: boolean };
        vmis: JsonVmi[];
      };
    await waitFor(
      'every example reconciled',
      async () => {
        const s = await statusJson();
        return s.vmis.length === expected.length && s.vmis.every((v) => v.state !== 'pending');
      },
      60_000,
    );
    const json = await statusJson();
    assert.deepEqual(json.vmis.map((v) => `${v.namespace}/${v.name}`).sort(), expected);
    assert.equal(json.watch.mode, 'local');
    const broken = json.vmis.find((v) => v.name === 'broken')!;
    assert.equal(broken.state, 'error');
    assert.equal(broken.lastError?.code, 'USERDATA_BASE64_INVALID');
    const good = json.vmis.filter((v) => v.name !== 'broken');
    for (const v of good)
      assert.ok(v.state === 'ready' || v.state === 'warning', `${v.namespace}/${v.name}: ${v.state}`);

    // The same process's metrics: valid, and the local source counts as synced.
    const metrics = await (await fetch(`${url}/metrics`)).text();
    const check = await promtoolCheck(metrics);
    assert.ok(check.ok, check.output);
    const samples = parseExposition(metrics);
    assert.equal(sampleValue(samples, 'vmseed_informer_synced'), 1);
    assert.equal(sampleValue(samples, 'vmseed_vmis', { state: 'error' }), 1);
    assert.equal(sampleValue(samples, 'vmseed_reconcile_errors_total', { code: 'USERDATA_BASE64_INVALID' }), 1);
    assert.equal((await fetch(`${url}/readyz`)).status, 200);

    const page = await browser.context.newPage();
    const problems: string[] = [];
    page.on('console', (m) => {
      if (m.type() === 'error' || m.type() === 'warning') problems.push(`${m.type()}: ${m.text()}`);
    });
    page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
    page.on('requestfailed', (r) => problems.push(`requestfailed: ${r.url()}`));

    const res = await page.goto(`${url}/status`);
    assert.equal(res?.status(), 200);
    assert.match(await page.title(), /\(1 error\)/);
    const rows = page.locator('tr.vmi');
    assert.equal(await rows.count(), expected.length);
    const names = await page.locator('tr.vmi td.vmi-name').allInnerTexts();
    assert.deepEqual(
      names
        .map((n) => n.split('\n').map((x) => x.trim()))
        .map(([name, ns]) => `${ns}/${name}`)
        .sort(),
      expected,
    );
    // Errors first; the broken VMI's code and our message are visible.
    assert.equal(await rows.first().getAttribute('data-state'), 'error');
    const errorRow = page.locator('tr.vmi[data-state="error"]');
    const errorText = await errorRow.innerText();
    assert.match(errorText, /broken[\s\S]*USERDATA_BASE64_INVALID/);
    assert.ok(errorText.includes(broken.lastError.message), 'the error message as in /status.json');
    assert.ok(await errorRow.locator('.err').isVisible());
    // Each ready row shows the image size and hash that /status.json reports.
    for (const v of good) {
      const row = page
        .locator('tr.vmi')
        .filter({ has: page.locator(`a.name[href="/status/${v.namespace}/${v.name}"]`) });
      const text = await row.innerText();
      assert.ok(text.includes(v.contentHash!.slice(0, 12)), `${v.name}: hash on the page`);
      assert.ok(text.includes(v.datasource!), `${v.name}: datasource on the page`);
    }
    assert.match(await page.locator('#watch').innerText(), /local/);
    assert.ok(
      await page.evaluate('document.documentElement.scrollWidth <= window.innerWidth'),
      'no horizontal overflow at 1500 px',
    );
    await mkdir(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS, 'status-agent.png'), fullPage: true });

    // Filter by clicking: errors only, then ready only.
    await Promise.all([
      page.waitForURL(/\/status\?state=error$/),
      page.locator('ul.counts a[data-state="error"]').click(),
    ]);
    assert.deepEqual(await page.locator('tr.vmi a.name').allInnerTexts(), ['broken']);
    await Promise.all([
      page.waitForURL(/\/status\?state=ready$/),
      page.locator('ul.counts a[data-state="ready"]').click(),
    ]);
    const readyNames = good
      .filter((v) => v.state === 'ready')
      .map((v) => v.name)
      .sort();
    assert.deepEqual((await page.locator('tr.vmi a.name').allInnerTexts()).sort(), readyNames);

    // Detail page of a ConfigDrive VMI: its files and sizes, as in the ISO on disk.
    const cd = good.find((v) => v.datasource === 'configdrive')!;
    await page.goto(`${url}/status`);
    await Promise.all([
      page.waitForURL(new RegExp(`/status/${cd.namespace}/${cd.name}$`)),
      page.locator(`a.name[href="/status/${cd.namespace}/${cd.name}"]`).click(),
    ]);
    const fileRows = await page
      .locator('table.files tbody tr')
      .evaluateAll((els) => els.map((e) => [...e.querySelectorAll('td')].map((td) => td.textContent ?? '')));
    assert.ok(fileRows.length >= 2);
    assert.deepEqual(
      fileRows.map((r) => r[0]),
      cd.files!.map((f) => f.path),
    );
    // The sizes the page states are the sizes of the files inside the image.
    const listing = execFileSync('isoinfo', ['-i', cd.imagePath!, '-R', '-l'], { encoding: 'utf8' });
    for (const f of cd.files!) {
      const base = f.path.split('/').pop()!;
      const line = listing.split('\n').find((l) => l.trimEnd().endsWith(` ${base}`) && /^-/.test(l.trim()));
      assert.ok(line, `${f.path} in the ISO`);
      assert.equal(Number(line.trim().split(/\s+/)[4]), f.size, `${f.path} size`);
      const shown = fileRows.find((r) => r[0] === f.path)![1];
      assert.ok(shown.includes(f.size >= 1024 ? `(${f.size} B)` : `${f.size}`), `${f.path}: ${shown}`);
    }
    const main = await page.locator('main').innerText();
    assert.match(main, new RegExp(cd.contentHash!));
    // Local mode runs without libvirt: the page says so rather than "not injected".
    assert.match(main, /injection\s+off \(--libvirt off\)/);
    await page.screenshot({ path: join(ARTIFACTS, 'status-agent-detail.png'), fullPage: true });

    // The broken VMI's detail page shows the problem.
    await page.goto(`${url}/status/default/broken`);
    assert.match(await page.locator('#problems').innerText(), /USERDATA_BASE64_INVALID/);

    assert.deepEqual(problems, []);
    child.kill('SIGTERM');
    assert.equal(await exited, 0);
  },
);
