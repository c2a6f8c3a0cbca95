// Harness test (of the test fixtures, not of vmseed).
// Proves the busybox test guest (e2e/support/guest): a real Debian kernel under
// QEMU TCG mounts seed images made by genisoimage by their label and prints the
// files byte for byte; the HTTP mode fetches them through QEMU user networking.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { bootWithImage, runQemu } from './support/guest/qemu.ts';
import { busyboxCmdline, ensureBusyboxGuest, parseConsole } from './support/guest/busybox.ts';

async function genisoimage(
  label: string,
  files: Record<string, Buffer>,
): Promise<{ image: string; cleanup: () => Promise<void> }> {
  const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-guest-test-'));
  const tree = path.join(dir, 'tree');
  for (const [name, bytes] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(tree, name)), { recursive: true });
    await writeFile(path.join(tree, name), bytes);
  }
  const image = path.join(dir, 'seed.iso');
  execFileSync('genisoimage', ['-quiet', '-output', image, '-volid', label, '-joliet', '-rock', tree]);
  return { image, cleanup: () => rm(dir, { recursive: true, force: true }) };
}

const nocloud = {
  'user-data': Buffer.from('#cloud-config\nruncmd:\n  - echo "marker ünïcødé"\n'),
  'meta-data': Buffer.from('instance-id: iid-guest-test\nlocal-hostname: guest\n'),
  // Binary and larger than one base64 line, to catch wrapping/stray-line bugs.
  'network-config': randomBytes(48 * 1024),
};

test('harness: busybox guest prints NoCloud files from a genisoimage cidata image on a virtio disk', async () => {
  const seed = await genisoimage('cidata', nocloud);
  try {
    const r = await bootWithImage({
      image: seed.image,
      label: 'cidata',
      files: Object.keys(nocloud),
      timeoutMs: 90_000,
    });
    assert.equal(r.done, true);
    assert.ok(r.labelFound, 'label found');
    assert.match(r.labelFound.dev, /^\/dev\/vd[a-z]$/);
    for (const [name, bytes] of Object.entries(nocloud)) assert.deepEqual(r.files.get(name), bytes, name);
    assert.deepEqual(r.missing, []);
  } finally {
    await seed.cleanup();
  }
});

test('harness: busybox guest prints ConfigDrive files (nested openstack/latest/) from a config-2 SCSI CD-ROM', async () => {
  const files = {
    'openstack/latest/meta_data.json': Buffer.from(
      JSON.stringify({ uuid: '0b7e3c1e-8a57-4a65-bd7f-1f1d5d3e3f10', hostname: 'cd' }),
    ),
    'openstack/latest/user_data': Buffer.from('#!/bin/sh\necho configdrive\n'),
  };
  const seed = await genisoimage('config-2', files);
  try {
    const r = await bootWithImage({
      image: seed.image,
      label: 'config-2',
      files: [...Object.keys(files), 'openstack/latest/network_data.json'],
      cdrom: true,
      timeoutMs: 90_000,
    });
    assert.equal(r.done, true);
    assert.match(r.labelFound?.dev ?? '', /^\/dev\/sr[0-9]$/);
    for (const [name, bytes] of Object.entries(files)) assert.deepEqual(r.files.get(name), bytes, name);
    assert.deepEqual(r.missing, ['openstack/latest/network_data.json']);
  } finally {
    await seed.cleanup();
  }
});

test('harness: busybox guest reports a label it cannot find instead of hanging', async () => {
  const seed = await genisoimage('other', { 'user-data': Buffer.from('x') });
  try {
    const r = await bootWithImage({
      image: seed.image,
      label: 'cidata',
      files: ['user-data'],
      timeoutMs: 60_000,
      waitSeconds: 2,
    });
    assert.equal(r.done, true);
    assert.equal(r.labelTimeout, true);
    assert.equal(r.labelFound, undefined);
    assert.equal(r.files.size, 0);
  } finally {
    await seed.cleanup();
  }
});

test('harness: busybox guest fetches NoCloud files over HTTP through user networking (restrict=on, guestfwd to loopback)', async () => {
  const served: Record<string, Buffer> = { 'user-data': nocloud['user-data'], 'meta-data': nocloud['meta-data'] };
  const requests: string[] = [];
  const server = createServer((req, res) => {
    requests.push(req.url ?? '');
    const m = /^\/v1\/tok\/(.+)$/.exec(req.url ?? '');
    const body = m ? served[m[1]] : undefined;
    if (!body) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'content-length': body.length }).end(body);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const port = (server.address() as AddressInfo).port;
    const r = await bootWithImage({
      url: 'http://10.0.2.100/v1/tok/',
      guestfwd: { guestIp: '10.0.2.100', guestPort: 80, hostPort: port },
      files: ['meta-data', 'user-data', 'network-config'],
      timeoutMs: 90_000,
    });
    assert.equal(r.done, true);
    assert.deepEqual(r.files.get('user-data'), served['user-data']);
    assert.deepEqual(r.files.get('meta-data'), served['meta-data']);
    assert.deepEqual(r.missing, ['network-config']);
    assert.deepEqual(requests, ['/v1/tok/meta-data', '/v1/tok/user-data', '/v1/tok/network-config']);
  } finally {
    server.close();
  }
});

test('harness: restrict=on: the guest cannot reach the host loopback through the gateway, only the guestfwd', async () => {
  let hits = 0;
  const server = createServer((_req, res) => {
    hits++;
    res.end('should not be reachable\n');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const port = (server.address() as AddressInfo).port;
    // Without restrict=on, slirp maps 10.0.2.2 to the host's 127.0.0.1.
    const r = await bootWithImage({
      url: `http://10.0.2.2:${port}/`,
      files: ['user-data'],
      fetchTimeoutSeconds: 3,
      timeoutMs: 60_000,
    });
    assert.equal(r.done, true);
    assert.deepEqual(r.missing, ['user-data']);
    assert.equal(hits, 0);
    // Control: the same fetch with restrict=off does reach the host.
    const open = await bootWithImage({
      url: `http://10.0.2.2:${port}/`,
      files: ['user-data'],
      restrict: false,
      timeoutMs: 60_000,
    });
    assert.equal(open.files.get('user-data')?.toString(), 'should not be reachable\n');
    assert.equal(hits, 1);
  } finally {
    server.close();
  }
});

test('harness: parseConsole skips kernel lines inside a file block and decodes wrapped base64', () => {
  const data = randomBytes(200);
  const b64 = data.toString('base64');
  const text = [
    '[    1.0] booting',
    'VMSEED-LABEL-FOUND /dev/vdb 2.50',
    'VMSEED-FILE-BEGIN openstack/latest/meta_data.json',
    b64.slice(0, 76) + '\r',
    '[    2.6] virtio_blk virtio2: [vdc] 8 512-byte logical blocks',
    b64.slice(76),
    'VMSEED-FILE-END openstack/latest/meta_data.json',
    'VMSEED-FILE-MISSING user_data',
    'VMSEED-DONE 2.7',
  ].join('\n');
  const r = parseConsole(text);
  assert.deepEqual(r.files.get('openstack/latest/meta_data.json'), data);
  assert.deepEqual(r.missing, ['user_data']);
  assert.deepEqual(r.labelFound, { dev: '/dev/vdb', uptime: 2.5 });
  assert.equal(r.done, true);
  assert.equal(parseConsole('VMSEED-FILE-BEGIN x\nAAAA\n').done, false);
});

test('harness: runQemu kills QEMU on timeout and on `until`, leaving no process behind', async () => {
  const guest = await ensureBusyboxGuest();
  const base = {
    kernel: guest.kernel,
    initrd: guest.initramfs,
    append: busyboxCmdline({ files: ['user-data'], waitSeconds: 600 }),
  };
  const alive = (pid: number) => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  const stopped = await runQemu({ ...base, timeoutMs: 60_000, until: (c) => c.includes('VMSEED-BOOTED') });
  assert.equal(stopped.stoppedByUntil, true);
  assert.equal(alive(stopped.pid), false);
  // The guest waits 600 s for a disk that never comes: only the timeout ends it.
  const timed = await runQemu({ ...base, timeoutMs: 4_000 });
  assert.equal(timed.timedOut, true);
  assert.equal(alive(timed.pid), false);
});
