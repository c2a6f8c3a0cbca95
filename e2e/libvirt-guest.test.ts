// The injector with a real guest (busybox initramfs on Debian's kernel, TCG):
// the seed gate holds a paused guest until its seed is in, the guest reads
// it, and virtio hot-unplug really completes because the guest answers ACPI.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import { e2eInjector } from './support/libvirt-mode.ts';
import { VmseedError } from '../src/errors.ts';
import type { InjectionTarget } from '../src/libvirt/injector-contract.ts';
import {
  ensureLibvirtd,
  uniqueName,
  destroyDomain,
  defineDomain,
  domblklist,
  domstate,
  virsh,
} from './support/libvirtd.ts';
import { guestDomainXml, waitForConsole } from './support/libvirt-guest.ts';

let dir: string;
const domains: string[] = [];

before(async () => {
  await ensureLibvirtd();
  dir = mkdtempSync(join(tmpdir(), 'vmseed-e2e-guest-'));
});

after(async () => {
  for (const d of domains) await destroyDomain(d);
  rmSync(dir, { recursive: true, force: true });
});

// The seed image here comes from genisoimage, the reference tool, so this
// test is about injection only (the ISO writer has its own tests).
function seedIso(label: string, userData: string): string {
  const src = join(dir, `${label}-src`);
  mkdirSync(src);
  writeFileSync(join(src, 'user-data'), userData);
  writeFileSync(join(src, 'meta-data'), `instance-id: ${label}\n`);
  const iso = join(dir, `${label}.iso`);
  execFileSync('genisoimage', [
    '-quiet',
    '-output',
    iso,
    '-volid',
    'cidata',
    '-joliet',
    '-rock',
    join(src, 'user-data'),
    join(src, 'meta-data'),
  ]);
  return iso;
}

function target(name: string): InjectionTarget {
  return {
    namespace: 'e2e',
    name,
    uid: `uid-${name}`,
    datasource: 'nocloud',
    annotations: {},
  };
}

test(
  'virtio: paused guest gets its seed, is resumed, reads it; seed replaced live; eject really detaches',
  { timeout: 300_000 },
  async () => {
    const name = uniqueName('guest');
    const domain = `e2e_${name}`;
    domains.push(domain);
    const consoleLog = join(dir, `${name}.console`);
    await defineDomain(
      await guestDomainXml({ name: domain, consoleLog, cmdline: 'vmseed.after=stay vmseed.wait=240' }),
    );
    await virsh('start', '--paused', domain);

    const userData = `#cloud-config\n# ${name}\nruncmd: [echo hello]\n`;
    const first = seedIso(`one-${name}`, userData);
    const inj = e2eInjector({ detachTimeoutMs: 60_000 });
    const r = await inj.inject(target(name), first, { resume: true });
    assert.equal(r.action, 'attached');
    assert.equal(r.domainState, 'paused');
    assert.equal(r.resumed, true);
    assert.equal(r.seededAfterBoot, false);
    assert.equal(await domstate(domain), 'running');

    const seen = await waitForConsole(consoleLog, (c) => c.done, 180_000);
    assert.ok(seen.labelFound, 'the guest found a disk labelled cidata');
    assert.equal(seen.files.get('user-data')?.toString('utf8'), userData);
    assert.equal(seen.files.get('meta-data')?.toString('utf8'), `instance-id: one-${name}\n`);

    // The seed changed while the guest runs: the old disk must be unplugged
    // (the guest answers ACPI) before the new one can take its target.
    const second = seedIso(`two-${name}`, '#cloud-config\n');
    const r2 = await inj.inject(target(name), second, { resume: true });
    assert.equal(r2.action, 'replaced');
    assert.deepEqual(r2.flags, ['--live', '--config']);
    assert.equal(r2.seededAfterBoot, true);
    assert.deepEqual(await domblklist(domain), [{ type: 'file', device: 'disk', target: r.targetDev, source: second }]);
    assert.deepEqual(await domblklist(domain, true), [
      { type: 'file', device: 'disk', target: r.targetDev, source: second },
    ]);
    assert.equal((await inj.inject(target(name), second, { resume: true })).action, 'none');

    const e = await inj.eject(target(name));
    assert.equal(e.action, 'detached');
    // eject returns only once the disk is gone from the live domain.
    assert.deepEqual(await domblklist(domain), []);
    assert.deepEqual(await domblklist(domain, true), []);
    assert.doesNotMatch(await virsh('dumpxml', domain), /ua-vmseed/);
    await waitForConsole(consoleLog, (c) => c.labelGoneUptime !== undefined, 60_000);
  },
);

test('virtio detach on a paused guest cannot complete: DETACH_TIMEOUT, retryable', { timeout: 120_000 }, async () => {
  const name = uniqueName('stuck');
  const domain = `e2e_${name}`;
  domains.push(domain);
  const consoleLog = join(dir, `${name}.console`);
  await defineDomain(await guestDomainXml({ name: domain, consoleLog, cmdline: 'vmseed.after=stay vmseed.wait=240' }));
  await virsh('start', '--paused', domain);
  const inj = e2eInjector({ detachTimeoutMs: 1_000 });
  const t: InjectionTarget = { ...target(name), annotations: {} };
  await inj.inject(t, seedIso(`s-${name}`, '#cloud-config\n'), { resume: true });
  await assert.rejects(inj.eject(t), (err: unknown) => {
    assert.ok(err instanceof VmseedError);
    assert.equal(err.code, 'DETACH_TIMEOUT');
    assert.equal(err.retryable, true);
    return true;
  });
});
