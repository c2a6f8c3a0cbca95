// The process injectAsAgent (agent-seed.ts) starts inside the agent's view
// of the node: vmseed's own injector, made by makeInjector from the shipped
// manifest's arguments (the kubevirt preset: the launcher's socket and
// ephemeral-disks under /pods, SCSI sdzz, live only), with only --libvirt
// set to the run's mode, attaches one stored image to one VMI's domain and
// prints the InjectionResult as JSON on stdout. Nothing of node:test is
// imported here: its report would mix with the result.
//
//   node agent-injector-main.ts <virsh|rpc> <InjectionTarget JSON> <image path>
import { makeInjector } from '../../src/commands/agent/agent-command.ts';
import { loadConfig } from '../../src/config/config.ts';
import type { InjectionTarget } from '../../src/libvirt/injector-contract.ts';
import { readDaemonSetAgent, withOverrides } from './daemonset-agent.ts';

const [mode, targetJson, imagePath] = process.argv.slice(2);
if (!mode || !targetJson || !imagePath) throw new Error('usage: agent-injector-main.ts MODE TARGET_JSON IMAGE');
// Cluster mode needs a node name; the injector does not depend on it.
const config = loadConfig(withOverrides(readDaemonSetAgent().args, { libvirt: mode }), { NODE_NAME: 'replica' }, '/');
if (config?.libvirt.platform !== 'kubevirt') throw new Error('the manifest does not configure the kubevirt platform');
const injector = makeInjector(config);
if (!injector) throw new Error(`no injector for --libvirt=${mode}`);
try {
  const result = await injector.inject(JSON.parse(targetJson) as InjectionTarget, imagePath);
  process.stdout.write(JSON.stringify(result));
} finally {
  await injector.client.close();
}
