// The RPC client when the daemon misbehaves, against a private libvirtd
// (session mode, its own socket) so killing and stopping it disturbs no
// other test: killed and restarted in the middle of work, and hung with
// SIGSTOP.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RpcLibvirtClient } from '../src/libvirt/rpc/rpc-client.ts';
import type { LibvirtEvent } from '../src/libvirt/libvirt-client.ts';
import { buildSeedDiskXml, parseDomainXml } from '../src/libvirt/disk-xml.ts';
import { VmseedError } from '../src/errors.ts';
import { emptyDomainXml, uniqueName } from './support/libvirtd.ts';
import { startPrivateLibvirtd, type PrivateLibvirtd } from './support/private-libvirtd.ts';

let daemon: PrivateLibvirtd;
let dir: string;

before(async () => {
  daemon = await startPrivateLibvirtd();
  dir = mkdtempSync(join(tmpdir(), 'vmseed-e2e-rpc-daemon-'));
});

after(async () => {
  await daemon.stop();
  rmSync(dir, { recursive: true, force: true });
});

function waitForEvent(
  client: RpcLibvirtClient,
  pred: (e: LibvirtEvent) => boolean,
  what: string,
  ms = 30_000,
): Promise<LibvirtEvent> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => {
      off();
      reject(new Error(`no ${what} event within ${ms} ms`));
    }, ms);
    const off = client.onEvent((e) => {
      if (!pred(e)) return;
      clearTimeout(t);
      off();
      resolve(e);
    });
  });
}

test('libvirtd killed and restarted during work: every read completes, an attach sent meanwhile lands once, events come back', async () => {
  const domain = `e2e_${uniqueName('restart')}`;
  await daemon.define(emptyDomainXml({ name: domain, scsiController: true }));
  const client = new RpcLibvirtClient({
    timeoutMs: 30_000,
    keepaliveIntervalMs: 500,
    keepaliveTimeoutMs: 1_000,
    backoffInitialMs: 20,
    backoffMaxMs: 500,
  });
  const seen: LibvirtEvent[] = [];
  client.onEvent((e) => seen.push(e));
  const stopWatching = client.watch(daemon.uri);
  try {
    assert.equal((await client.domainInfo(daemon.uri, domain)).state, 'shutoff');
    const firstPid = daemon.pid();

    let stopReading = false;
    let reads = 0;
    const reader = (async () => {
      while (!stopReading) {
        const info = await client.domainInfo(daemon.uri, domain);
        assert.equal(info.state, 'shutoff');
        reads++;
      }
    })();
    await new Promise((r) => setTimeout(r, 200));
    const readsBefore = reads;
    const down = waitForEvent(client, (e) => e.type === 'connection' && e.state === 'down', 'connection down');
    const up = waitForEvent(client, (e) => e.type === 'connection' && e.state === 'up' && e.reconnected, 'reconnected');
    const restarting = daemon.restart({ downMs: 500 });
    await down;
    // Sent while the daemon is gone: it waits for the new connection
    // instead of failing, and is sent exactly once.
    const seed = join(dir, 'restart.iso');
    writeFileSync(seed, Buffer.alloc(64 * 1024));
    const attach = client.attachDevice(
      daemon.uri,
      domain,
      buildSeedDiskXml({ sourceFile: seed, targetDev: 'sda', bus: 'scsi' }),
      { live: false, config: true },
    );
    await restarting;
    await up;
    await attach;
    await new Promise((r) => setTimeout(r, 200));
    stopReading = true;
    await reader;
    assert.notEqual(daemon.pid(), firstPid);
    assert.ok(reads > readsBefore, 'reads went on after the restart');
    const disks = parseDomainXml(await client.domainXml(daemon.uri, domain, { inactive: true })).disks;
    assert.deepEqual(
      disks.map((d) => d.sourceFile),
      [seed],
    );

    // Event callbacks were registered again on the new connection.
    const other = `e2e_${uniqueName('after-restart')}`;
    const defined = waitForEvent(
      client,
      (e) => e.type === 'lifecycle' && e.domain === other && e.event === 'defined',
      'defined after restart',
    );
    await daemon.define(emptyDomainXml({ name: other }));
    await defined;
  } finally {
    stopWatching();
    await client.close();
  }
});

test('hung libvirtd (SIGSTOP): calls fail at their deadline with LIBVIRT_TIMEOUT, the connection is torn down, and works again after SIGCONT', async () => {
  const domain = `e2e_${uniqueName('hung')}`;
  await daemon.define(emptyDomainXml({ name: domain }));
  const client = new RpcLibvirtClient({ timeoutMs: 30_000, keepaliveIntervalMs: 60_000, keepaliveTimeoutMs: 1_000 });
  try {
    assert.equal((await client.domainInfo(daemon.uri, domain)).state, 'shutoff');
    const down = waitForEvent(client, (e) => e.type === 'connection' && e.state === 'down', 'connection down');
    daemon.signal('SIGSTOP');
    try {
      const started = performance.now();
      const err = await client.domainInfo(daemon.uri, domain, { timeoutMs: 1_000 }).then(
        () => undefined,
        (e: unknown) => e,
      );
      assert.ok(err instanceof VmseedError, String(err));
      assert.equal(err.code, 'LIBVIRT_TIMEOUT', err.message);
      assert.equal(err.kind, 'retryable');
      // Loose bound: the point is that it did not wait on the daemon.
      assert.ok(performance.now() - started < 15_000);
      // The unanswered keepalive probe drops the socket.
      await down;
      // A new connection to the stopped daemon: the kernel accepts it, the
      // daemon never answers; the open fails at the deadline too.
      const fresh = new RpcLibvirtClient({ timeoutMs: 1_000 });
      try {
        const e2 = await fresh.version(daemon.uri).then(
          () => undefined,
          (e: unknown) => e,
        );
        assert.ok(e2 instanceof VmseedError && e2.code === 'LIBVIRT_TIMEOUT', String(e2));
      } finally {
        await fresh.close();
      }
    } finally {
      daemon.signal('SIGCONT');
    }
    assert.equal((await client.domainInfo(daemon.uri, domain)).state, 'shutoff');
  } finally {
    await client.close();
  }
});

test('100 level-based injections (read state and XML, attach if missing) while libvirtd is killed and restarted: all complete, each disk once', async (t) => {
  const names = Array.from({ length: 100 }, (_, i) => `e2e_${uniqueName(`inj${i}`)}`);
  for (const d of names) await daemon.define(emptyDomainXml({ name: d, scsiController: true }));
  const seed = join(dir, 'many.iso');
  writeFileSync(seed, Buffer.alloc(64 * 1024));
  const disk = buildSeedDiskXml({ sourceFile: seed, targetDev: 'sda', bus: 'scsi' });
  const client = new RpcLibvirtClient({ timeoutMs: 30_000, backoffInitialMs: 20, backoffMaxMs: 500 });
  const errors = new Map<string, number>();
  let attaches = 0;
  // What the injector does: look, change only what is missing, and on a
  // retryable error look again (an attach whose connection broke may have
  // landed).
  const inject = async (d: string) => {
    for (let attempt = 0; attempt < 20; attempt++) {
      try {
        await client.domainInfo(daemon.uri, d);
        const present = parseDomainXml(await client.domainXml(daemon.uri, d, { inactive: true })).disks.some(
          (x) => x.sourceFile === seed,
        );
        if (present) return;
        attaches++;
        await client.attachDevice(daemon.uri, d, disk, { live: false, config: true });
        return;
      } catch (e) {
        if (!(e instanceof VmseedError) || e.kind !== 'retryable') throw e;
        errors.set(e.code, (errors.get(e.code) ?? 0) + 1);
      }
    }
    throw new Error(`${d}: not injected after 20 attempts`);
  };
  try {
    let done = 0;
    const all = Promise.all(
      names.map(async (d, i) => {
        // Spread over time so the restart lands in the middle.
        await new Promise((r) => setTimeout(r, i * 10));
        await inject(d);
        done++;
      }),
    );
    await new Promise((r) => setTimeout(r, 400));
    const doneBeforeRestart = done;
    await daemon.restart({ downMs: 300 });
    await all;
    assert.ok(doneBeforeRestart < 100, 'the restart happened while injections were running');
    t.diagnostic(
      `done before the restart: ${doneBeforeRestart}; attach calls: ${attaches}; retried errors: ${JSON.stringify([...errors])}`,
    );
    const disks = await Promise.all(
      names.map(async (d) => parseDomainXml(await client.domainXml(daemon.uri, d, { inactive: true })).disks.length),
    );
    assert.deepEqual(
      disks,
      names.map(() => 1),
    );
    // Only a few attaches can be in doubt: those on the wire at the kill.
    assert.ok(attaches >= 100 && attaches <= 110, `attach calls: ${attaches}; errors: ${JSON.stringify([...errors])}`);
    for (const code of errors.keys())
      assert.ok(['LIBVIRT_CONNECTION_LOST', 'TARGET_IN_USE'].includes(code), `unexpected ${code}`);
  } finally {
    await client.close();
  }
});
