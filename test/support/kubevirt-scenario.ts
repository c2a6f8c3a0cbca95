// One agent, in-process, in a KubeVirt-like setting that makes every kind of
// API call the agent has: the informer (list, watch), a Secret and a
// ConfigMap read for cloud-init sources, Events created and (on repeats)
// patched, and the seed gate's unpause. libvirt is FakeLibvirt behind the
// real VirshInjector with {podUID} templates; images are published into
// launcher "pods" under a temp directory. The fake API server's recorded
// requests are what the RBAC test checks the ClusterRole against.
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeKube, type RequestRecord } from './fake-kube.ts';
import { FakeLibvirt } from './fake-libvirt.ts';
import { startAgent, tempDir, vmi, waitFor, NODE } from './agent-harness.ts';
import { KubeConnectionApi } from '../../src/agent/kube-api.ts';
import { kubevirtUnpause } from '../../src/agent/kubevirt-resume.ts';
import { VirshInjector } from '../../src/libvirt/injector.ts';
import { DirPublisher } from '../../src/libvirt/publish.ts';
import type { VmiObject } from '../../src/cloudinit/kube-types.ts';

export const HOTPLUG = 'volumes/kubernetes.io~empty-dir/hotplug-disks';

export function launcherVmi(name: string, namespace: string, cloudInit: string, pod: string, extra: { paused?: boolean } = {}): VmiObject {
  const v = vmi(name, { namespace, cloudInit });
  if (extra.paused) v.metadata.annotations!['vmseed.io/resume-after-seed'] = 'true';
  v.status = {
    nodeName: NODE,
    phase: 'Running',
    ...(extra.paused ? { conditions: [{ type: 'Paused', status: 'True' }] } : {}),
    // The migration source elsewhere is listed too; only this node's counts.
    activePods: { [pod]: NODE, [`${pod}-elsewhere`]: 'node-b' },
  };
  return v;
}

// `namespaces`: the agent in namespaced mode (--namespaces); `rbac`: the
// objects (Roles, bindings...) the fake API server authorises with instead
// of manifests/daemonset.yaml.
export async function runKubevirtScenario(options: { namespaces?: string[]; rbac?: unknown[] } = {}): Promise<{ requests: RequestRecord[]; unpaused: string[]; lv: FakeLibvirt }> {
  const fake = await FakeKube.start(options.rbac ? { rbac: options.rbac } : {});
  const dir = await tempDir('vmseed-kubevirt-');
  const pods = join(dir.path, 'pods');
  const connection = fake.connection();
  const api = new KubeConnectionApi(connection, { timeoutMs: 2000 });
  const lv = new FakeLibvirt();
  try {
    for (const pod of ['pod-1', 'pod-2']) await mkdir(join(pods, pod, HOTPLUG), { recursive: true });
    fake.setSecret({ metadata: { name: 'vm1-userdata', namespace: 'team-a' }, stringData: { userdata: '#cloud-config\nhostname: vm1\n' } });
    fake.setConfigMap({ metadata: { name: 'vm1-files', namespace: 'team-a' }, data: { userdata: '#cloud-config\nhostname: files\n' } });
    lv.domains.set('team-a_vm1', { state: 'paused', persistent: false, live: [], config: [], unplugs: true });
    lv.domains.set('team-a_files', { state: 'shut off', persistent: true, live: [], config: [], unplugs: true });
    fake.applyVmi(launcherVmi('vm1', 'team-a', 'secretRef: {name: vm1-userdata}\n', 'pod-1', { paused: true }));
    fake.applyVmi(launcherVmi('files', 'team-a', 'userDataFrom: {kind: configmap, name: vm1-files, key: userdata}\n', 'pod-2'));
    // A Secret that never comes: SeedFailed, then repeats of it (PATCH).
    fake.applyVmi(launcherVmi('broken', 'team-a', 'secretRef: {name: missing}\n', 'pod-3'));
    const injector = new VirshInjector({
      spawner: lv,
      uriTemplate: `qemu+unix:///session?socket=${pods}/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`,
      imagePathTemplate: '/var/run/kubevirt/hotplug-disks/{basename}',
      publisher: new DirPublisher({ dirTemplate: `${pods}/{podUID}/${HOTPLUG}` }),
      resume: kubevirtUnpause(api),
      sleep: async () => {},
    });
    const h = await startAgent(fake, { stateDir: join(dir.path, 'seeds'), injector, ...(options.namespaces ? { namespaces: options.namespaces } : {}) });
    try {
      await waitFor('unpause', () => fake.unpaused.includes('team-a/vm1'), 10_000);
      await waitFor('files seeded', () => lv.domains.get('team-a_files')!.config.some((d) => d.alias === 'ua-vmseed'), 10_000);
      await waitFor('a repeated Event patched', () => fake.requests.some((r) => r.resource === 'events' && r.verb === 'patch'), 10_000);
    } finally {
      await h.stop();
    }
    return { requests: [...fake.requests], unpaused: [...fake.unpaused], lv };
  } finally {
    await connection.close();
    await fake.close();
    await dir.remove();
  }
}
