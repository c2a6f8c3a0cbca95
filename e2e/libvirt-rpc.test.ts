// Both LibvirtClient implementations against the real system libvirtd + QEMU
// (TCG, domains with no OS and a virtio-scsi controller, so a SCSI CD-ROM
// detaches without a guest): same answers, same error codes. The RPC client
// also delivers domain events and multiplexes many calls on one socket.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RpcLibvirtClient } from '../src/libvirt/rpc/rpc-client.ts';
import { VirshLibvirtClient } from '../src/libvirt/virsh/virsh-client.ts';
import type { LibvirtClient, LibvirtEvent } from '../src/libvirt/libvirt-client.ts';
import { buildSeedDiskXml, parseDomainXml, SEED_ALIAS } from '../src/libvirt/disk-xml.ts';
import { VmseedError } from '../src/errors.ts';
import {
  ensureLibvirtd,
  uniqueName,
  destroyDomain,
  emptyDomainXml,
  defineDomain,
  domblklist,
  virsh,
  LIBVIRT_URI,
} from './support/libvirtd.ts';

let dir: string;
const domains: string[] = [];
const rpc = new RpcLibvirtClient({ timeoutMs: 60_000 });
const viaVirsh = new VirshLibvirtClient({ timeoutMs: 60_000 });

before(async () => {
  await ensureLibvirtd();
  dir = mkdtempSync(join(tmpdir(), 'vmseed-e2e-rpc-'));
});

after(async () => {
  await rpc.close();
  for (const d of domains) await destroyDomain(d);
  rmSync(dir, { recursive: true, force: true });
});

function seedFile(label: string): string {
  const p = join(dir, `${label}.iso`);
  writeFileSync(p, Buffer.alloc(64 * 1024, label));
  return p;
}

async function newDomain(prefix: string, start: 'no' | 'paused' | 'transient' = 'no'): Promise<string> {
  const domain = `e2e_${uniqueName(prefix)}`;
  domains.push(domain);
  const xml = emptyDomainXml({ name: domain, scsiController: true });
  if (start === 'transient') {
    await defineDomain(xml, 'create');
    return domain;
  }
  await defineDomain(xml);
  if (start === 'paused') await virsh('start', '--paused', domain);
  return domain;
}

async function rejectsWith(p: Promise<unknown>, code: string): Promise<VmseedError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof VmseedError, `expected a VmseedError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    return e;
  }
  assert.fail(`expected ${code}, but the call succeeded`);
}

// Collects events; waitFor resolves on the first one that matches.
function eventLog(client: LibvirtClient) {
  const seen: LibvirtEvent[] = [];
  const waiters: Array<{ pred: (e: LibvirtEvent) => boolean; resolve: (e: LibvirtEvent) => void }> = [];
  client.onEvent((e) => {
    seen.push(e);
    for (const w of [...waiters])
      if (w.pred(e)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(e);
      }
  });
  return {
    seen,
    waitFor(pred: (e: LibvirtEvent) => boolean, what: string, ms = 30_000): Promise<LibvirtEvent> {
      const hit = seen.find(pred);
      if (hit) return Promise.resolve(hit);
      return new Promise((resolve, reject) => {
        const t = setTimeout(
          () => reject(new Error(`no ${what} event within ${ms} ms; saw ${JSON.stringify(seen.slice(-5))}`)),
          ms,
        );
        waiters.push({
          pred,
          resolve: (e) => {
            clearTimeout(t);
            resolve(e);
          },
        });
      });
    },
  };
}

for (const [label, client] of [
  ['rpc', rpc],
  ['virsh', viaVirsh],
] as const) {
  describe(`${label} client`, () => {
    test('version of the daemon', async () => {
      // The daemon runs the same libvirt as this virsh (one machine).
      const expected = (await virsh('version')).match(/Using library: libvirt ([\d.]+)/)?.[1];
      assert.ok(expected, 'virsh version printed the library version');
      assert.equal(await client.version(LIBVIRT_URI), expected);
    });

    test('state and persistence: defined, paused, transient', async () => {
      const defined = await newDomain(`${label}-st-def`);
      assert.deepEqual(await client.domainInfo(LIBVIRT_URI, defined), {
        state: 'shutoff',
        rawState: 'shutoff',
        persistent: true,
      });
      const paused = await newDomain(`${label}-st-pau`, 'paused');
      assert.deepEqual(await client.domainInfo(LIBVIRT_URI, paused), {
        state: 'paused',
        rawState: 'paused',
        persistent: true,
      });
      const transient = await newDomain(`${label}-st-tra`, 'transient');
      assert.deepEqual(await client.domainInfo(LIBVIRT_URI, transient), {
        state: 'running',
        rawState: 'running',
        persistent: false,
      });
    });

    test('attach --live only: in the live XML, not in the inactive one; detach removes it', async () => {
      const domain = await newDomain(`${label}-att`, 'paused');
      const seed = seedFile(`${label}-att`);
      const xml = buildSeedDiskXml({ sourceFile: seed, targetDev: 'sda', bus: 'scsi' });
      await client.attachDevice(LIBVIRT_URI, domain, xml, { live: true, config: false });
      const live = parseDomainXml(await client.domainXml(LIBVIRT_URI, domain)).disks;
      assert.deepEqual(
        live.map((d) => [d.targetDev, d.bus, d.sourceFile, d.alias]),
        [['sda', 'scsi', seed, SEED_ALIAS]],
      );
      const inactive = parseDomainXml(await client.domainXml(LIBVIRT_URI, domain, { inactive: true })).disks;
      assert.deepEqual(inactive, []);
      const view = await client.domainView(LIBVIRT_URI, domain);
      assert.deepEqual(view.info, { state: 'paused', rawState: 'paused', persistent: true });
      assert.deepEqual(parseDomainXml(view.liveXml).disks, live);
      assert.deepEqual(parseDomainXml(view.inactiveXml!).disks, []);
      assert.deepEqual(
        (await domblklist(domain)).map((r) => r.source),
        [seed],
      );

      await client.detachDevice(LIBVIRT_URI, domain, xml, { live: true, config: false });
      // A SCSI CD-ROM leaves at once, guest or not.
      for (let i = 0; i < 100 && (await domblklist(domain)).length > 0; i++)
        await new Promise((r) => setTimeout(r, 50));
      assert.deepEqual(await domblklist(domain), []);
    });

    test('attach --config on a defined domain: only in the inactive XML', async () => {
      const domain = await newDomain(`${label}-cfg`);
      const seed = seedFile(`${label}-cfg`);
      await client.attachDevice(
        LIBVIRT_URI,
        domain,
        buildSeedDiskXml({ sourceFile: seed, targetDev: 'sda', bus: 'scsi' }),
        { live: false, config: true },
      );
      assert.deepEqual(
        parseDomainXml(await client.domainXml(LIBVIRT_URI, domain, { inactive: true })).disks.map((d) => d.sourceFile),
        [seed],
      );
    });

    test('errors: unknown domain, detach of a missing disk, a duplicated alias, a missing image', async () => {
      await rejectsWith(client.domainInfo(LIBVIRT_URI, `e2e_${uniqueName('absent')}`), 'DOMAIN_NOT_FOUND');
      await rejectsWith(client.domainXml(LIBVIRT_URI, `e2e_${uniqueName('absent')}`), 'DOMAIN_NOT_FOUND');
      const domain = await newDomain(`${label}-err`, 'paused');
      const seed = seedFile(`${label}-err`);
      const xml = buildSeedDiskXml({ sourceFile: seed, targetDev: 'sda', bus: 'scsi' });
      await rejectsWith(
        client.detachDevice(LIBVIRT_URI, domain, xml, { live: true, config: false }),
        'DEVICE_NOT_FOUND',
      );
      await client.attachDevice(LIBVIRT_URI, domain, xml, { live: true, config: false });
      // (A second CD-ROM on the same target is a media change, not an error.)
      const sameAlias = buildSeedDiskXml({ sourceFile: seedFile(`${label}-err2`), targetDev: 'sdb', bus: 'scsi' });
      await rejectsWith(
        client.attachDevice(LIBVIRT_URI, domain, sameAlias, { live: true, config: false }),
        'ALIAS_IN_USE',
      );
      const missing = buildSeedDiskXml({
        sourceFile: join(dir, 'does-not-exist.iso'),
        targetDev: 'sdb',
        bus: 'scsi',
        alias: 'ua-missing',
      });
      await rejectsWith(
        client.attachDevice(LIBVIRT_URI, domain, missing, { live: true, config: false }),
        'SEED_FILE_NOT_ACCESSIBLE',
      );
    });

    test('resume a paused domain', async () => {
      const domain = await newDomain(`${label}-res`, 'paused');
      await client.resume(LIBVIRT_URI, domain);
      assert.equal((await client.domainInfo(LIBVIRT_URI, domain)).state, 'running');
    });
  });
}

test('rpc: lifecycle events of one domain arrive in order: defined, started, resumed, stopped, undefined', async () => {
  const log = eventLog(rpc);
  const stop = rpc.watch(LIBVIRT_URI);
  try {
    // The subscription is made when the connection opens.
    await rpc.version(LIBVIRT_URI);
    const domain = `e2e_${uniqueName('events')}`;
    domains.push(domain);
    await defineDomain(emptyDomainXml({ name: domain, scsiController: true }));
    await virsh('start', '--paused', domain);
    await rpc.resume(LIBVIRT_URI, domain);
    await virsh('destroy', domain);
    await virsh('undefine', domain);
    await log.waitFor((e) => e.type === 'lifecycle' && e.domain === domain && e.event === 'undefined', 'undefined');
    // destroy may first report QEMU's own shutdown (SIGTERM'd); whether it
    // does depends on timing, so it is left out.
    const mine = log.seen
      .filter((e) => e.type === 'lifecycle' && e.domain === domain && e.event !== 'shutdown')
      .map((e) => (e.type === 'lifecycle' ? e.event : ''));
    // start --paused reports started then suspended.
    assert.deepEqual(mine, ['defined', 'started', 'suspended', 'resumed', 'stopped', 'undefined']);
  } finally {
    stop();
  }
});

test('rpc: detaching the SCSI disk delivers a device-removed event with its alias', async () => {
  const log = eventLog(rpc);
  const stop = rpc.watch(LIBVIRT_URI);
  try {
    const domain = await newDomain('rpc-devrm', 'paused');
    const xml = buildSeedDiskXml({ sourceFile: seedFile('devrm'), targetDev: 'sda', bus: 'scsi' });
    await rpc.attachDevice(LIBVIRT_URI, domain, xml, { live: true, config: false });
    await rpc.detachDevice(LIBVIRT_URI, domain, xml, { live: true, config: false });
    const ev = await log.waitFor((e) => e.type === 'device-removed' && e.domain === domain, 'device-removed');
    assert.equal(ev.type === 'device-removed' && ev.alias, SEED_ALIAS);
    assert.deepEqual(parseDomainXml(await rpc.domainXml(LIBVIRT_URI, domain)).disks, []);
  } finally {
    stop();
  }
});

test('rpc: 50 domains read and changed concurrently over one connection', async () => {
  const names: string[] = [];
  for (let i = 0; i < 50; i++) {
    const d = `e2e_${uniqueName(`many${i}`)}`;
    domains.push(d);
    names.push(d);
  }
  // Defined through virsh one after the other: the point is the reads.
  for (const d of names) await defineDomain(emptyDomainXml({ name: d }));
  const client = new RpcLibvirtClient({ timeoutMs: 60_000 });
  try {
    const [infos, xmls] = await Promise.all([
      Promise.all(names.map((d) => client.domainInfo(LIBVIRT_URI, d))),
      Promise.all(names.map((d) => client.domainXml(LIBVIRT_URI, d))),
    ]);
    assert.ok(infos.every((i) => i.state === 'shutoff' && i.persistent));
    assert.deepEqual(
      xmls.map((x) => parseDomainXml(x).name),
      names,
    );
    // Different domains are not serialized against each other.
    const seed = seedFile('many');
    const disk = buildSeedDiskXml({ sourceFile: seed, targetDev: 'sda', bus: 'scsi' });
    await Promise.all(names.map((d) => client.attachDevice(LIBVIRT_URI, d, disk, { live: false, config: true })));
    const after = await Promise.all(names.map((d) => client.domainXml(LIBVIRT_URI, d, { inactive: true })));
    assert.ok(
      after.every((x) => parseDomainXml(x).disks.length === 1 && parseDomainXml(x).disks[0].sourceFile === seed),
    );
    assert.equal(client.manager.openCount, 1);
  } finally {
    await client.close();
  }
});

test('rpc: mutations of one domain run one at a time, in call order', async () => {
  const domain = await newDomain('rpc-serial', 'paused');
  // address: null: libvirt places each (the seed's fixed drive address would collide).
  const xmls = ['sda', 'sdb', 'sdc'].map((t, i) =>
    buildSeedDiskXml({
      sourceFile: seedFile(`serial-${t}`),
      targetDev: t,
      bus: 'scsi',
      alias: `ua-serial${i}`,
      address: null,
    }),
  );
  // Started together; if they overlapped libvirt would still cope, so the
  // proof is the order the disks end up in the live XML (attach appends).
  await Promise.all(xmls.map((x) => rpc.attachDevice(LIBVIRT_URI, domain, x, { live: true, config: false })));
  const disks = parseDomainXml(await rpc.domainXml(LIBVIRT_URI, domain)).disks;
  assert.deepEqual(
    disks.map((d) => d.alias),
    ['ua-serial0', 'ua-serial1', 'ua-serial2'],
  );
});

test('rpc: a domain destroyed while an attach is in flight: a typed error or a completed attach, never a hang; the connection serves on', async () => {
  const outcomes: string[] = [];
  for (let i = 0; i < 3; i++) {
    const domain = await newDomain(`rpc-gone${i}`, 'transient');
    const xml = buildSeedDiskXml({ sourceFile: seedFile(`gone${i}`), targetDev: 'sda', bus: 'scsi' });
    const [attach] = await Promise.allSettled([
      rpc.attachDevice(LIBVIRT_URI, domain, xml, { live: true, config: false }),
      virsh('destroy', domain),
    ]);
    if (attach.status === 'rejected') {
      const e = attach.reason;
      assert.ok(e instanceof VmseedError, String(e));
      assert.equal(e.kind, 'retryable', e.message);
      outcomes.push(e.code);
    } else {
      outcomes.push('attached');
    }
    // Transient: gone with the destroy.
    await rejectsWith(rpc.domainInfo(LIBVIRT_URI, domain), 'DOMAIN_NOT_FOUND');
  }
  assert.ok(
    outcomes.every((o) => ['attached', 'DOMAIN_NOT_FOUND', 'LIBVIRT_FAILED'].includes(o)),
    outcomes.join(','),
  );
  assert.match(await rpc.version(LIBVIRT_URI), /^\d+\.\d+\.\d+$/);
});
