// The seed in place before the guest looks, without the seed gate and
// without the owner doing anything: on the replica node (session libvirtd as
// 107 per launcher, the agent as the DaemonSet runs it), the VMI is first
// seen without activePods; then its launcher pod, the launcher's socket and
// the domain's definition come seconds apart, in two orders; the domain is
// started last, not paused, and its busybox guest looks for the seed once at
// boot. The agent must have been connected to the launcher's libvirt and
// subscribed before the start (it has the start event's time), attach
// right after it, and see the guest's first read of the disk in libvirt's
// block statistics. Margins are printed, not asserted (bench/first-boot.ts).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { firstBootRun, startFirstBootNode, type FirstBootNode, type Step } from './support/first-boot.ts';

let node: FirstBootNode | undefined;

before(async () => {
  node = await startFirstBootNode(2);
});

after(async () => {
  await node?.stop();
});

const ORDERS: Array<{ order: Step[]; delayMs: number[] }> = [
  // KubeVirt's usual order: pod, then its libvirt, then the domain.
  { order: ['pod', 'socket', 'define'], delayMs: [1500, 2000, 2000] },
  // The pod reaches the VMI's status late: libvirt and the domain already there.
  { order: ['socket', 'define', 'pod'], delayMs: [1000, 1000, 2000] },
];

for (const [i, o] of ORDERS.entries()) {
  test(
    `first boot without the gate (${o.order.join(' → ')} → start): subscribed before the start, attached, the guest found it and read it`,
    { timeout: 240_000 },
    async () => {
      const r = await firstBootRun(node!, i, { ...o, startDelayMs: 2000 });
      const f = r.firstBoot;
      console.log(
        `${o.order.join(' → ')}: attached ${f.attachAfterStartSeconds} s after the start event, ` +
          `${(Date.parse(f.attachedAt) - r.startIssuedAt) / 1000} s after virsh start was issued; ` +
          `read ${f.readAfterStartSeconds} s after the start; the guest ${r.guestFound ? 'found' : 'missed'} it`,
      );
      assert.ok(f.domainStartedAt !== undefined, 'the agent received the start event: it was subscribed before');
      assert.ok(Date.parse(f.domainStartedAt) >= r.startIssuedAt - 5, 'that start, not an earlier one');
      assert.ok(f.attachAfterStartSeconds !== undefined);
      assert.equal(f.watch, 'read', 'the guest read its seed disk');
      assert.ok(f.readAfterStartSeconds !== undefined && f.readAfterStartSeconds >= f.attachAfterStartSeconds);
      assert.ok(r.guestFound, `the guest's one look at boot found the seed:\n${r.console.slice(-1500)}`);
    },
  );
}
