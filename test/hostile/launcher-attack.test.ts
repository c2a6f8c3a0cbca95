// The agent as the DaemonSet runs it (uid 107 + group 0, its NODE_OPTIONS,
// --libvirt=rpc) beside hostile launchers running the attack that costs the
// agent most (bench/hostile-launcher.ts measures all of them beside 1,000
// VMIs): the process stays up, its liveness probe never fails as the
// kubelet counts failures, it stays within the container's memory limit,
// and a VMI added during the attack is seeded. The budgets are the
// manifest's own: livenessProbe timeoutSeconds 2 and failureThreshold 3,
// memory limit 256 Mi.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { probeHealthz, startHostileNode, type Attack } from './launcher-attack.ts';
import { RemoteProc } from '../../src/libvirt/rpc/protocol.ts';

const ATTACK: Attack = 'xml-1mib';
const NORMAL = 50;
const LAUNCHERS = 8;
const ATTACK_SECONDS = 8;
const PROBE_TIMEOUT_MS = 2_000;
const FAILURE_THRESHOLD = 3;
const LIMIT_BYTES = 256 * 1024 * 1024;

test(
  `hostile launchers (${ATTACK}) beside ${NORMAL} VMIs: the agent stays up, /healthz answers, memory stays under the limit, new VMIs are seeded`,
  { timeout: 150_000 },
  async (t) => {
    const node = await startHostileNode({ normal: NORMAL, launchers: LAUNCHERS, attack: ATTACK });
    t.after(() => node.stop());
    const failures: string[] = [];
    let inARow = 0;
    let worstRun = 0;
    let probes = 0;
    let probing = true;
    const prober = (async () => {
      while (probing) {
        const p = await probeHealthz(node.healthz, PROBE_TIMEOUT_MS);
        probes++;
        if (p.ok) inARow = 0;
        else {
          failures.push(`${p.why} after ${p.ms.toFixed(0)} ms`);
          worstRun = Math.max(worstRun, ++inARow);
        }
        await sleep(250);
      }
    })();
    try {
      const end = Date.now() + ATTACK_SECONDS * 1000;
      const seeded = node.addVmi('during-attack');
      let added = false;
      while (Date.now() < end || !added) {
        added ||= await seeded();
        if (Date.now() > end + 30_000) break;
        await sleep(100);
      }
      assert.ok(added, 'a VMI added during the attack is seeded');
      assert.equal(await node.seeded(), NORMAL, 'every normal VMI seeded');
    } finally {
      probing = false;
      await prober;
    }
    const status = await node.status();
    const hostile = (status.libvirt?.connections ?? []).filter((c) => c.uri.includes('virtqemud-sock'));
    t.diagnostic(
      `${probes} probes, ${failures.length} failed (${failures.slice(0, 3).join('; ')}); VmHWM ${(node.peak().hwmBytes / 1024 / 1024).toFixed(1)} MiB; ${node.launchers.reduce((n, l) => n + l.connections(), 0)} connections to the hostile daemons`,
    );
    assert.equal(node.agent.child.exitCode, null, `the agent exited:\n${node.agent.log().slice(-3000)}`);
    assert.equal(node.agent.child.signalCode, null);
    assert.ok(worstRun < FAILURE_THRESHOLD, `${worstRun} /healthz failures in a row: ${failures.join('; ')}`);
    assert.ok(probes >= ATTACK_SECONDS, `${probes} probes`);
    assert.ok(node.peak().hwmBytes < LIMIT_BYTES, `VmHWM ${node.peak().hwmBytes} bytes`);
    assert.equal(hostile.length, LAUNCHERS, 'every hostile launcher was dialled');
    const xmlReads = node.launchers.map(
      (l) => l.daemon.received.filter((p) => p.header.proc === RemoteProc.DOMAIN_GET_XML_DESC).length,
    );
    assert.ok(
      xmlReads.every((n) => n >= 1),
      `each hostile daemon had its 1 MiB XML read (${xmlReads.join(', ')})`,
    );
  },
);
