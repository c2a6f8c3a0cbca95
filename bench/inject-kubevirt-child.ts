// Run by bench/inject-kubevirt.ts inside the DaemonSet container's view of
// the node (/pods, its user, groups and no capabilities): the injector as
// the shipped manifest's arguments configure it (`--platform=kubevirt
// --libvirt=rpc`: publish into the launcher's ephemeral-disks, SCSI sdzz,
// live only), on one launcher's libvirt. Prints one JSON line of samples.
//
//   node bench/inject-kubevirt-child.ts POD_UID IMAGE CYCLES
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { timeSettled } from './timing.ts';
import { loadConfig } from '../src/config/config.ts';
import { makeInjector } from '../src/commands/agent/agent-command.ts';
import { buildSeedDiskXml, SEED_ALIAS } from '../src/libvirt/disk-xml.ts';
import type { InjectionTarget } from '../src/libvirt/injector-contract.ts';
import { readDaemonSetAgent } from '../e2e/support/daemonset-agent.ts';

const run = promisify(execFile);
const [podUid, image, cyclesArg] = process.argv.slice(2);
if (!podUid || !image || !cyclesArg) throw new Error('usage: inject-kubevirt-child.ts POD_UID IMAGE CYCLES');
const cycles = Number(cyclesArg);

const config = loadConfig(readDaemonSetAgent().args, { NODE_NAME: 'bench-node' }, process.cwd());
if (!config) throw new Error('the manifest args asked for --help');
const injector = makeInjector(config);
if (!injector) throw new Error('the manifest runs with --libvirt=off');
const client = injector.client;
const target: InjectionTarget = {
  namespace: 'bench',
  name: 'launcher',
  uid: podUid,
  datasource: 'nocloud',
  annotations: {},
  launcherPods: [podUid],
};
const { uri, domain } = injector.locate(target);

// The removal a detach waits for, so the next cycle starts from no disk.
function removed(): Promise<void> {
  return new Promise((resolve) => {
    const off = client.onEvent((e) => {
      if (e.type === 'device-removed' && e.domain === domain && e.alias === SEED_ALIAS) {
        off();
        resolve();
      }
    });
  });
}

try {
  client.watch(uri);
  await client.version(uri);
  const s = {
    inject: [] as number[],
    injectStaged: [] as number[],
    eject: [] as number[],
    view: [] as number[],
    attach: [] as number[],
    virshVersion: [] as number[],
  };
  let published = '';
  // One cycle untimed: the JIT, our directory in the volume (made by the
  // first publish into a pod), and virsh's first start are not what a
  // running agent pays per seed.
  await injector.inject(target, image);
  await injector.eject(target);
  await run('virsh', ['-q', '-c', uri, 'version']);
  for (let i = 0; i < cycles; i++) {
    // The reference as this process sees it: spawn + connect to the
    // launcher's socket, a no-op. Every call is timed after the same pause
    // (bench/timing.ts).
    s.virshVersion.push(await timeSettled(() => run('virsh', ['-q', '-c', uri, 'version'])));
    s.inject.push(
      await timeSettled(async () => {
        const r = await injector.inject(target, image);
        if (r.action !== 'attached' || r.targetDev !== 'sdzz') throw new Error(`inject: ${JSON.stringify(r)}`);
      }),
    );
    // The seed gate's path: the agent's pass before the domain existed
    // (DOMAIN_NOT_FOUND) left the copy in the pod, so inject() at the
    // domain's start finds it and only reads and attaches.
    await injector.eject(target);
    await injector.stage(target, image);
    s.injectStaged.push(
      await timeSettled(async () => {
        const r = await injector.inject(target, image);
        if (r.action !== 'attached' || r.targetDev !== 'sdzz') throw new Error(`inject: ${JSON.stringify(r)}`);
      }),
    );
    // The path the domain opened: what a bare attach below attaches again.
    published ||= (await client.domainView(uri, domain)).liveXml.match(/<source file='([^']+vmseed-[^']+)'/)?.[1] ?? '';
    s.eject.push(
      await timeSettled(async () => {
        if ((await injector.eject(target)).action !== 'detached') throw new Error('eject detached nothing');
      }),
    );
    // libvirt's part alone, on the same connection: one read, one attach.
    // (The published copy went with the eject: put it back first.)
    await injector.stage(target, image);
    s.view.push(await timeSettled(() => client.domainView(uri, domain)));
    const xml = buildSeedDiskXml({ sourceFile: published, targetDev: 'sdzz', bus: 'scsi', alias: SEED_ALIAS });
    s.attach.push(await timeSettled(() => client.attachDevice(uri, domain, xml, { live: true, config: false })));
    const gone = removed();
    await client.detachDevice(uri, domain, xml, { live: true, config: false });
    await gone;
    await injector.unstage(target);
  }
  process.stdout.write(`${JSON.stringify({ uri, domain, published, ...s })}\n`);
} finally {
  await client.close();
}
