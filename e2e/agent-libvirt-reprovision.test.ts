// vmseed.io/on-secret-change=reprovision as the guest sees it: the real agent
// CLI (local mode, `--libvirt virsh`), the real libvirtd and the busybox
// guest under TCG. The guest boots on a seed whose user-data comes from a
// Secret; the Secret is edited while it runs, the agent swaps the disk for
// the new image, and the guest's next boot (the domain started again from
// its configuration) reads the new user-data and meta-data with a new
// instance-id: what makes cloud-init run as on a first boot.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, rm } from 'node:fs/promises';
import { ensureLibvirtd, domblklist, virsh } from './support/libvirtd.ts';
import { waitForConsole } from './support/libvirt-guest.ts';
import { vmiYaml, waitUntil, type AgentProcess } from './support/agent-process.ts';
import { pausedBusyboxChain } from './support/busybox-chain.ts';

const NS = 'e2e';

before(async () => {
  await ensureLibvirtd();
});

function secretYaml(name: string, userdata: string): string {
  return (
    JSON.stringify({ apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace: NS }, stringData: { userdata } }) +
    '\n'
  );
}

function instanceIdOf(metaData: Buffer | undefined): string | undefined {
  return /"instance-id": ?"([^"]+)"/.exec(metaData?.toString('utf8') ?? '')?.[1];
}

async function tail(agent: AgentProcess, consoleLog: string): Promise<string> {
  const c = await readFile(consoleLog, 'utf8').catch(() => '');
  const s = JSON.stringify((await agent.status().catch(() => undefined))?.vmis);
  return `status ${s}\nagent log tail:\n${agent.log().split('\n').slice(-25).join('\n')}\nconsole tail:\n${c.split('\n').slice(-15).join('\n')}`;
}

test(
  'reprovision: a Secret edit reaches the running guest as a new disk, and its next boot reads a new instance-id',
  { timeout: 300_000 },
  async (t) => {
    const { agent, name, domain, consoleLog } = await pausedBusyboxChain(t, { namespace: NS, prefix: 'reprov' });

    const first = `#cloud-config\n# ${name}: first\n`;
    await agent.put('secret.yaml', secretYaml('ud', first));
    const vm = JSON.parse(
      vmiYaml({ namespace: NS, name, cloudInit: 'secretRef: {name: ud}\n', resumeAfterSeed: true }),
    ) as { metadata: { annotations: Record<string, string> } };
    vm.metadata.annotations['vmseed.io/on-secret-change'] = 'reprovision';
    await agent.put('vm.yaml', JSON.stringify(vm) + '\n');

    const rec = await waitUntil(
      'the VMI ready and injected',
      async () => {
        const r = await agent.vmi(NS, name);
        return r?.state === 'ready' && r.injection ? r : undefined;
      },
      60_000,
      () => tail(agent, consoleLog),
    );
    const boot1 = await waitForConsole(consoleLog, (c) => c.done, 180_000);
    assert.equal(boot1.files.get('user-data')?.toString('utf8'), first);
    const id1 = instanceIdOf(boot1.files.get('meta-data'));
    assert.ok(id1, 'an instance-id in the first seed');

    // The edit: a new image, swapped into the running domain.
    const second = `#cloud-config\n# ${name}: second\n`;
    await agent.put('secret.yaml', secretYaml('ud', second));
    const rec2 = await waitUntil(
      'the edited seed injected',
      async () => {
        const r = await agent.vmi(NS, name);
        // A swap into a running domain is ready with SEEDED_AFTER_BOOT (warning).
        return (r?.state === 'ready' || r?.state === 'warning') &&
          r.contentHash !== rec.contentHash &&
          r.injection?.at !== rec.injection!.at
          ? r
          : undefined;
      },
      90_000,
      () => tail(agent, consoleLog),
    );
    assert.equal(rec2.lastError, undefined, JSON.stringify(rec2.lastError));
    assert.deepEqual(
      (await domblklist(domain)).map((b) => b.source),
      [rec2.imagePath],
    );
    // The old disk left the running guest.
    await waitForConsole(consoleLog, (c) => c.labelGoneUptime !== undefined, 60_000);

    // The next boot: the domain stopped and started again from its
    // configuration, which holds the new disk (a reset would end the domain:
    // the guest XML says on_reboot destroy). A fresh console file for it.
    await virsh('destroy', domain);
    await rm(consoleLog, { force: true });
    await virsh('start', domain);
    const boot2 = await waitForConsole(consoleLog, (c) => c.done, 180_000);
    assert.equal(boot2.files.get('user-data')?.toString('utf8'), second);
    const id2 = instanceIdOf(boot2.files.get('meta-data'));
    assert.ok(id2, 'an instance-id in the new seed');
    assert.notEqual(id2, id1, 'reprovision: a new instance-id');
    assert.equal(await agent.stop(), 0);
  },
);
