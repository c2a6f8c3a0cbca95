// `vmseed agent --redirect-status-url` as a real subprocess against the
// sidecar's real /readyz server: its /status.json and status page follow
// the redirect from in place to missing to unreachable, and the agent's own
// /readyz stays 200 throughout.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { tempDir, waitFor } from '../support/agent-harness.ts';
import { startRedirectHealth } from '../../src/redirect/health-server.ts';
import { createRedirectMetrics } from '../../src/redirect/redirect-metrics.ts';
import type { RedirectMissingReason } from '../../src/redirect/keeper.ts';

const ROOT = new URL('../../', import.meta.url).pathname;

test(
  "the agent shows the sidecar's redirect state on /status.json and /status, not in its /readyz",
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-redirect-agent-');
    const keeper: { inPlace: boolean; lastError: string | undefined; reason: RedirectMissingReason } = {
      inPlace: true,
      lastError: undefined,
      reason: 'not-checked',
    };
    const health = await startRedirectHealth({
      listen: { host: '127.0.0.1', port: 0 },
      keeper,
      metrics: createRedirectMetrics(),
    });
    let healthOpen = true;
    await mkdir(join(dir.path, 'manifests'));
    const child = spawn(
      process.execPath,
      [
        join(ROOT, 'src/main.ts'),
        'agent',
        '--local',
        'manifests',
        '--state-dir',
        'seeds',
        '--listen',
        '127.0.0.1:0',
        '--redirect-status-url',
        `http://127.0.0.1:${health.address.port}/readyz`,
      ],
      { cwd: dir.path, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let log = '';
    child.stdout.on('data', (d) => (log += d));
    child.stderr.on('data', (d) => (log += d));
    t.after(async () => {
      if (child.exitCode === null) child.kill('SIGKILL');
      if (healthOpen) await health.close();
      await dir.remove();
    });
    const url = await waitFor('listen url', () => /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(log)?.[1], 60_000);
    type Redirect = { state: string; reason?: string; since: string };
    const redirect = async () =>
      ((await (await fetch(`${url}/status.json`)).json()) as { redirect?: Redirect }).redirect;
    const until = async (state: string) => {
      let last: Redirect | undefined;
      await waitFor(`redirect ${state}`, async () => (last = await redirect())?.state === state, 60_000);
      return last!;
    };

    await until('in-place');
    assert.match(await (await fetch(`${url}/status`)).text(), /data-redirect="in-place"/);

    keeper.inPlace = false;
    keeper.reason = 'apply-failed';
    keeper.lastError = 'nft said <no>';
    const missing = await until('missing');
    assert.equal(missing.reason, 'apply-failed: nft said <no>');
    const page = await (await fetch(`${url}/status`)).text();
    assert.match(page, /data-redirect="missing"/);
    assert.ok(page.includes('apply-failed: nft said &lt;no&gt;'));
    assert.equal((await fetch(`${url}/readyz`)).status, 200, "the agent's own readiness does not include the redirect");

    await health.close();
    healthOpen = false;
    const gone = await until('unreachable');
    assert.ok(Date.parse(gone.since) >= Date.parse(missing.since));
    assert.equal((await fetch(`${url}/readyz`)).status, 200);

    child.kill('SIGTERM');
    const code = await new Promise<number | null>((r) =>
      child.exitCode !== null ? r(child.exitCode) : child.on('exit', (c) => r(c)),
    );
    assert.equal(code, 0, log);
  },
);
