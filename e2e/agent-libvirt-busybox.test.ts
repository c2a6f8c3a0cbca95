// The whole chain, fast: the real agent CLI in local mode with
// `--libvirt virsh`, the real libvirtd, and the busybox guest under TCG.
// A VMI file dropped into the agent's directory becomes an image attached to
// its paused domain, which the seed gate resumes; the guest prints the
// user-data it finds. Edits replace the disk, deletion detaches it, and a
// domain that does not exist yet is retried without holding up other VMIs.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readlinkSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  ensureLibvirtd,
  uniqueName,
  defineDomain,
  domblklist,
  domstate,
  emptyDomainXml,
  virsh,
} from './support/libvirtd.ts';
import { waitForConsole } from './support/libvirt-guest.ts';
import {
  cleanupAll,
  removeDomainChecked,
  startAgentProcess,
  vmiYaml,
  waitUntil,
  type AgentProcess,
} from './support/agent-process.ts';
import { pausedBusyboxChain } from './support/busybox-chain.ts';

const NS = 'e2e';

before(async () => {
  await ensureLibvirtd();
});

function isoFile(image: string, file: string): string {
  return execFileSync('isoinfo', ['-i', image, '-R', '-x', `/${file}`], { encoding: 'utf8' });
}

// What QEMU really has open: after an in-place rewrite (rename over the old
// file) the old inode shows as "<path> (deleted)".
function qemuOpenFiles(domain: string): string[] {
  const pid = readFileSync(`/run/libvirt/qemu/${domain}.pid`, 'utf8').trim();
  const out: string[] = [];
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      out.push(readlinkSync(`/proc/${pid}/fd/${fd}`));
    } catch {
      /* closed meanwhile */
    }
  }
  return out;
}

function images(stateDir: string): string[] {
  if (!existsSync(stateDir)) return [];
  return (readdirSync(stateDir, { recursive: true }) as string[])
    .filter((p) => p.endsWith('.iso'))
    .map((p) => join(stateDir, p))
    .sort();
}

async function tail(agent: AgentProcess, consoleLog?: string): Promise<string> {
  const c =
    consoleLog && existsSync(consoleLog) ? readFileSync(consoleLog, 'utf8').split('\n').slice(-15).join('\n') : '';
  return `agent log tail:\n${agent.log().split('\n').slice(-25).join('\n')}${c ? `\nconsole tail:\n${c}` : ''}`;
}

test(
  'dropped VMI file: image written, attached to the paused domain, resumed, read by the guest; edit replaces it; delete detaches and removes it',
  { timeout: 300_000 },
  async (t) => {
    const { agent, name, domain, consoleLog } = await pausedBusyboxChain(t, { namespace: NS, prefix: 'chain' });

    const userData = `#cloud-config\n# ${name}: first\nruncmd:\n  - [echo, "hello from the seed"]\n`;
    await agent.put(
      'vm.yaml',
      vmiYaml({ namespace: NS, name, cloudInit: JSON.stringify({ userData }), resumeAfterSeed: true }),
    );

    const rec = await waitUntil(
      'the VMI ready and injected',
      async () => {
        const r = await agent.vmi(NS, name);
        return r?.state === 'ready' && r.injection ? r : undefined;
      },
      60_000,
      () => tail(agent, consoleLog),
    );
    assert.equal(rec.datasource, 'nocloud');
    assert.equal(rec.injection!.domain, domain);
    assert.equal(rec.injection!.domainState, 'paused');
    assert.equal(rec.injection!.resumed, true);
    assert.equal(rec.injection!.seededAfterBoot, false);
    assert.deepEqual(rec.injection!.flags, ['--live', '--config']);
    const [first] = images(agent.stateDir);
    assert.ok(first, 'an image in the state directory');
    assert.equal(rec.imagePath, first);
    assert.equal(isoFile(first, 'user-data'), userData);
    assert.equal(await domstate(domain), 'running');
    const blk = await domblklist(domain);
    assert.deepEqual(blk, [{ type: 'file', device: 'disk', target: rec.injection!.targetDev, source: first }]);
    assert.deepEqual(await domblklist(domain, true), blk);

    // The guest booted only after the seed was in (the gate), found it by
    // label and printed it.
    const seen = await waitForConsole(consoleLog, (c) => c.done, 180_000);
    assert.ok(seen.labelFound, 'the guest found a disk labelled cidata');
    assert.equal(seen.files.get('user-data')?.toString('utf8'), userData);
    assert.match(seen.files.get('meta-data')?.toString('utf8') ?? '', new RegExp(`"local-hostname": ?"${name}"`));

    // Edit: new user-data. The running domain must end up with one seed disk
    // whose bytes are the new ones, and QEMU must not keep the old file open.
    const edited = `#cloud-config\n# ${name}: second\n`;
    await agent.put(
      'vm.yaml',
      vmiYaml({ namespace: NS, name, cloudInit: JSON.stringify({ userData: edited }), resumeAfterSeed: true }),
    );
    const rec2 = await waitUntil(
      'the edited seed injected',
      async () => {
        const r = await agent.vmi(NS, name);
        return r?.state !== 'pending' &&
          r?.contentHash !== rec.contentHash &&
          r?.injection &&
          r.injection.at !== rec.injection!.at
          ? r
          : undefined;
      },
      90_000,
      () => tail(agent, consoleLog),
    );
    assert.equal(rec2.lastError, undefined, JSON.stringify(rec2.lastError));
    const now = images(agent.stateDir);
    assert.equal(now.length, 1, `one image: ${now.join(', ')}`);
    assert.equal(isoFile(now[0], 'user-data'), edited);
    const blk2 = await domblklist(domain);
    assert.equal(blk2.length, 1, JSON.stringify(blk2));
    assert.equal(blk2[0].source, now[0]);
    assert.deepEqual(await domblklist(domain, true), blk2);
    const open = qemuOpenFiles(domain).filter((f) => f.startsWith(agent.stateDir));
    assert.deepEqual(
      open.filter((f) => f.endsWith('(deleted)')),
      [],
      `QEMU still reads a replaced image: ${open.join(', ')}`,
    );
    // The old disk really left the guest before the new one came in.
    await waitForConsole(consoleLog, (c) => c.labelGoneUptime !== undefined, 60_000);

    // Delete: detached from the live domain and its config, image removed.
    await agent.remove('vm.yaml');
    await waitUntil(
      'the VMI gone from the status page',
      async () => (await agent.vmi(NS, name)) === undefined,
      60_000,
      () => tail(agent, consoleLog),
    );
    assert.deepEqual(await domblklist(domain), []);
    assert.deepEqual(await domblklist(domain, true), []);
    assert.doesNotMatch(await virsh('dumpxml', domain), /ua-vmseed/);
    assert.deepEqual(images(agent.stateDir), []);
    assert.equal(await agent.stop(), 0);
    assert.ok(!agent.log().includes('hello from the seed'), 'no user-data in the agent log');
  },
);

test(
  'domain not defined yet: DOMAIN_NOT_FOUND (retryable) on the status page, other VMIs served meanwhile, seeded once the domain appears',
  { timeout: 180_000 },
  async (t) => {
    const agent = await startAgentProcess();
    const late = uniqueName('late');
    const other = uniqueName('other');
    const lateDomain = `${NS}_${late}`;
    const otherDomain = `${NS}_${other}`;
    t.after(() =>
      cleanupAll(
        () => agent.dispose(),
        () => removeDomainChecked(lateDomain),
        () => removeDomainChecked(otherDomain),
      ),
    );

    // Shut-off persistent domains: the seed goes into the config (no QEMU).
    await defineDomain(emptyDomainXml({ name: otherDomain }));
    await agent.put(
      'late.yaml',
      vmiYaml({ namespace: NS, name: late, cloudInit: JSON.stringify({ userData: '#cloud-config\n# late\n' }) }),
    );

    const failing = await waitUntil(
      'DOMAIN_NOT_FOUND on the status page',
      async () => {
        const r = await agent.vmi(NS, late);
        return r?.state === 'pending' && r.lastError?.code === 'DOMAIN_NOT_FOUND' ? r : undefined;
      },
      30_000,
      () => tail(agent),
    );
    assert.equal(failing.lastError!.kind, 'retryable');
    assert.ok(failing.retries >= 1);
    // The image itself is ready: only the injection waits.
    assert.equal(images(agent.stateDir).length, 1);

    // This one uses KubeVirt's cloudInitNoCloud volume instead of the annotation.
    await agent.put(
      'other.yaml',
      vmiYaml({ namespace: NS, name: other, noCloudVolume: { userData: '#cloud-config\n# other\n' } }),
    );
    const served = await waitUntil(
      'the other VMI seeded',
      async () => {
        const r = await agent.vmi(NS, other);
        return r?.state === 'ready' && r.injection ? r : undefined;
      },
      30_000,
      () => tail(agent),
    );
    assert.deepEqual(served.injection!.flags, ['--config']);
    assert.deepEqual(
      (await domblklist(otherDomain, true)).map((b) => b.source),
      [served.imagePath],
    );
    assert.equal(isoFile(served.imagePath!, 'user-data'), '#cloud-config\n# other\n');
    assert.equal((await agent.vmi(NS, late))?.state, 'pending', 'still waiting for its domain');

    // Let it fail a few times (backoff grows), then define the domain.
    await waitUntil(
      'a few retries',
      async () => ((await agent.vmi(NS, late))?.retries ?? 0) >= 3,
      30_000,
      () => tail(agent),
    );
    await defineDomain(emptyDomainXml({ name: lateDomain }));
    const definedAt = Date.now();
    const seeded = await waitUntil(
      'the late VMI seeded',
      async () => {
        const r = await agent.vmi(NS, late);
        return r?.state === 'ready' && r.injection ? r : undefined;
      },
      60_000,
      () => tail(agent),
    );
    console.log(`# late domain seeded ${((Date.now() - definedAt) / 1000).toFixed(1)} s after it was defined`);
    assert.equal(seeded.lastError, undefined);
    assert.equal(seeded.retries, 0);
    assert.deepEqual(
      (await domblklist(lateDomain, true)).map((b) => b.source),
      [seeded.imagePath],
    );
    assert.equal((await domblklist(lateDomain, true)).length, 1);
    assert.equal(await agent.stop(), 0);
  },
);
