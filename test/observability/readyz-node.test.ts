// /readyz against real node conditions, flipped under a running agent:
// virsh missing (libvirt on) and then installed; the state directory on a
// small tmpfs filled up and then emptied, remounted read-only and then
// read-write (we run as root here: only the kernel's answers are used, no
// mode bits root would write through). Each time the status page shows the
// reason /readyz gives, and both recover without a restart.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createServer } from 'node:net';
import { chmod, mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { tempDir, waitFor } from '../support/agent-harness.ts';
import { readyz, startCliAgent } from '../support/agent-cli.ts';

const startCli = (args: string[]) => startCliAgent(args);

async function notReady(url: string, what: string, pattern: RegExp): Promise<string> {
  const r = await waitFor(
    `not ready: ${what}`,
    async () => {
      const x = await readyz(url);
      return x.status === 503 && pattern.test(x.body) && x;
    },
    60_000,
  ).catch(async (e: Error) => assert.fail(`${e.message}; /readyz said: ${JSON.stringify(await readyz(url))}`));
  // The status page and /status.json give the same reason.
  const page = await (await fetch(`${url}/status`)).text();
  const reason = r.body
    .split('\n')
    .find((l) => pattern.test(l))!
    .replace(/^- /, '');
  const html = reason
    .replaceAll('&', '&amp;')
    .replaceAll('<', '&lt;')
    .replaceAll('>', '&gt;')
    .replaceAll('"', '&quot;')
    .replaceAll("'", '&#39;');
  assert.ok(page.includes('id="readiness"') && page.includes(html), `the status page shows: ${reason}`);
  const json = (await (await fetch(`${url}/status.json`)).json()) as {
    readiness?: { ready: boolean; reasons: string[] };
  };
  assert.equal(json.readiness?.ready, false);
  assert.ok(json.readiness?.reasons.includes(reason), JSON.stringify(json.readiness));
  return r.body;
}

async function readyAgain(url: string, what: string): Promise<void> {
  await waitFor(`ready again: ${what}`, async () => (await readyz(url)).status === 200, 60_000);
  const page = await (await fetch(`${url}/status`)).text();
  assert.ok(!page.includes('id="readiness"'), 'no readiness panel once ready');
}

test(
  'libvirt on: /readyz 503 while --virsh-path does not exist, 200 once it does, 503 when not executable',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-readyz-virsh-');
    t.after(() => dir.remove());
    const manifests = join(dir.path, 'manifests');
    await mkdir(manifests);
    const virsh = join(dir.path, 'bin', 'virsh');
    // A socket of the test's own for the libvirt URI: only virsh is missing.
    const sock = createServer();
    await new Promise<void>((r) => sock.listen(join(dir.path, 'libvirt.sock'), r));
    t.after(() => sock.close());
    const run = startCli([
      '--local',
      manifests,
      '--state-dir',
      join(dir.path, 'seeds'),
      '--libvirt',
      'virsh',
      '--virsh-path',
      virsh,
      '--libvirt-uri',
      `qemu+unix:///session?socket=${join(dir.path, 'libvirt.sock')}`,
    ]);
    try {
      const url = await run.url();
      const body = await notReady(url, 'virsh missing', /virsh \(--virsh-path .*\) does not exist/);
      assert.ok(!/state directory/.test(body), `only virsh is wrong: ${body}`);
      await mkdir(join(dir.path, 'bin'));
      await writeFile(virsh, '#!/bin/sh\nexit 0\n', { mode: 0o755 });
      await readyAgain(url, 'virsh installed');
      await chmod(virsh, 0o644);
      await notReady(url, 'virsh not executable', /virsh \(--virsh-path .*\) is not executable/);
      await chmod(virsh, 0o755);
      await readyAgain(url, 'virsh executable');
    } finally {
      assert.equal(await run.stop(), 0, run.output().slice(-2000));
    }
  },
);

test(
  "libvirt on (rpc): /readyz 503 while the URI's socket is missing or not a socket, 200 once libvirt listens there",
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-readyz-socket-');
    t.after(() => dir.remove());
    const manifests = join(dir.path, 'manifests');
    await mkdir(manifests);
    const path = join(dir.path, 'run', 'virtqemud-sock');
    const run = startCli([
      '--local',
      manifests,
      '--state-dir',
      join(dir.path, 'seeds'),
      '--libvirt',
      'rpc',
      '--libvirt-uri',
      `qemu+unix:///session?socket=${path}`,
    ]);
    try {
      const url = await run.url();
      const body = await notReady(url, 'socket missing', /libvirt socket .*virtqemud-sock .* does not exist/);
      assert.ok(!/state directory/.test(body), `only the socket is wrong: ${body}`);
      await mkdir(join(dir.path, 'run'));
      await writeFile(path, '');
      await notReady(
        url,
        'a file, not a socket',
        /libvirt socket .*virtqemud-sock: .*virtqemud-sock is not a unix socket; refusing to connect/,
      );
      await rm(path);
      const sock = createServer();
      await new Promise<void>((r) => sock.listen(path, r));
      t.after(() => sock.close());
      await readyAgain(url, 'libvirt listening');
    } finally {
      assert.equal(await run.stop(), 0, run.output().slice(-2000));
    }
  },
);

test(
  'a state directory on a full tmpfs, then a read-only one: /readyz 503 with the reason, 200 once fixed',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-readyz-fs-');
    const state = join(dir.path, 'seeds');
    await mkdir(state);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=16m,mode=0750', 'vmseed-readyz', state]);
    t.after(async () => {
      execFileSync('umount', ['-l', state]);
      await dir.remove();
    });
    const manifests = join(dir.path, 'manifests');
    await mkdir(manifests);
    // 1 MiB user-data and network-data limits: ready needs 4 MiB free.
    const run = startCli([
      '--local',
      manifests,
      '--state-dir',
      state,
      '--max-user-data-bytes',
      String(1 << 20),
      '--max-network-data-bytes',
      String(1 << 20),
    ]);
    try {
      const url = await run.url();
      await readyAgain(url, 'a fresh tmpfs');

      // Fill it the way a runaway log would: until the kernel says ENOSPC.
      const fill = join(state, 'fill');
      try {
        execFileSync('dd', ['if=/dev/zero', `of=${fill}`, 'bs=1M'], { stdio: 'ignore' });
      } catch {
        // dd exits 1 at ENOSPC: that is the point.
      }
      const full = await notReady(url, 'disk full', /state directory .* is full: 0 B free, needs at least 4\.0 MiB/);
      assert.match(full, /is not writable \(ENOSPC\)/, 'the write probe fails too');
      await rm(fill);
      await readyAgain(url, 'space freed');

      // Read-only: what a remount after filesystem errors looks like.
      execFileSync('mount', ['-o', 'remount,ro', state]);
      await notReady(url, 'read-only', /state directory .* is not writable \(EROFS\)/);
      execFileSync('mount', ['-o', 'remount,rw', state]);
      await readyAgain(url, 'read-write again');
      // /healthz never cared: the process was alive throughout.
      assert.equal((await fetch(`${url}/healthz`)).status, 200);
    } finally {
      assert.equal(await run.stop(), 0, run.output().slice(-2000));
    }
  },
);
