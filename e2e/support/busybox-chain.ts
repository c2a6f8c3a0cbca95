// The setup the whole-chain busybox tests share: the agent CLI as a
// subprocess (agent-process.ts), a work directory for the console log, and
// a busybox guest's domain defined and started paused (the guest waits up
// to 240 s for its seed and stays up after reading it). All of it is
// cleaned up after the test: the agent first, then the domain, then the
// directory.
import type { TestContext } from 'node:test';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defineDomain, uniqueName, virsh } from './libvirtd.ts';
import { guestDomainXml } from './libvirt-guest.ts';
import { cleanupAll, removeDomainChecked, startAgentProcess, type AgentProcess } from './agent-process.ts';

export interface BusyboxChain {
  agent: AgentProcess;
  // The VMI's name; its domain is `<namespace>_<name>`.
  name: string;
  domain: string;
  consoleLog: string;
}

export async function pausedBusyboxChain(
  t: TestContext,
  o: { namespace: string; prefix: string; agentArgs?: string[] },
): Promise<BusyboxChain> {
  const agent = await startAgentProcess(o.agentArgs);
  const work = await mkdtemp(join(tmpdir(), `vmseed-e2e-${o.prefix}-`));
  const name = uniqueName(o.prefix);
  const domain = `${o.namespace}_${name}`;
  const consoleLog = join(work, 'console.log');
  t.after(() =>
    cleanupAll(
      () => agent.dispose(),
      () => removeDomainChecked(domain),
      () => rm(work, { recursive: true, force: true }),
    ),
  );
  await defineDomain(await guestDomainXml({ name: domain, consoleLog, cmdline: 'vmseed.after=stay vmseed.wait=240' }));
  await virsh('start', '--paused', domain);
  return { agent, name, domain, consoleLog };
}
