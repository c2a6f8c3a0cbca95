// A guest without cloud-init, on the real chain: the agent CLI in local mode
// with `--libvirt rpc`, the real libvirtd and the busybox guest under TCG.
// The agent sees the guest read its seed disk (libvirt's block statistics
// through the RPC client) and, since nothing can report cloud-init's
// progress (the datasource listener is off, and busybox runs no
// cloud-init), says "progress not reported" with the reason instead of
// nothing.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { ensureLibvirtd } from './support/libvirtd.ts';
import { waitForConsole } from './support/libvirt-guest.ts';
import { vmiYaml, waitUntil } from './support/agent-process.ts';
import { pausedBusyboxChain } from './support/busybox-chain.ts';

const NS = 'e2e';

before(async () => {
  await ensureLibvirtd();
});

test(
  'busybox guest: seed read by the guest (block statistics), progress not reported, with the reason',
  { timeout: 300_000 },
  async (t) => {
    const { agent, name, consoleLog } = await pausedBusyboxChain(t, {
      namespace: NS,
      prefix: 'noci',
      agentArgs: ['--libvirt', 'rpc'],
    });
    const userData = `#cloud-config\n# ${name}\n`;
    await agent.put(
      'vm.yaml',
      vmiYaml({ namespace: NS, name, cloudInit: JSON.stringify({ userData }), resumeAfterSeed: true }),
    );
    const tail = () => `agent log tail:\n${agent.log().split('\n').slice(-25).join('\n')}`;

    const rec = await waitUntil(
      'the seed read by the guest and progress not reported',
      async () => {
        const r = await agent.vmi(NS, name);
        return r?.firstBoot?.watch === 'read' && r.provisioning?.state === 'not-reported' ? r : undefined;
      },
      240_000,
      tail,
    );
    const seen = await waitForConsole(consoleLog, (c) => c.done, 120_000);
    assert.ok(seen.labelFound, 'the guest found its seed disk');
    assert.equal(seen.files.get('user-data')?.toString('utf8'), userData);

    const fb = rec.firstBoot!;
    assert.ok(fb.seedReadAt !== undefined && fb.readAfterAttachSeconds! >= 0, JSON.stringify(fb));
    const p = rec.provisioning!;
    assert.equal(p.boot, 0);
    assert.deepEqual(p.stages, []);
    assert.equal(
      p.reason,
      `the guest read its seed at ${fb.seedReadAt}; the seed does not ask cloud-init to report its progress: the NoCloud HTTP datasource is off (--datasource-listen), so cloud-init has nowhere to post its progress`,
    );
    assert.equal((await agent.status()).vmis.filter((v) => v.provisioning?.state === 'not-reported').length, 1);

    // Where people look: the list says it, the VMI's page has the timeline to the read and why it ends there.
    const list = await (await fetch(`${agent.url}/status`)).text();
    assert.match(list, /data-provisioning="not-reported"[^>]*>progress not reported</);
    const page = await (await fetch(`${agent.url}/status/${NS}/${name}`)).text();
    assert.match(page, /id="provisioning-timeline" data-provisioning="not-reported"/);
    for (const mark of [
      'seed written',
      'attached',
      'read by guest',
      'progress not reported',
      'the NoCloud HTTP datasource is off',
    ])
      assert.ok(page.includes(mark), mark);
    assert.equal(await agent.stop(), 0);
  },
);
