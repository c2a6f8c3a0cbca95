// One agent, in-process, in a KubeVirt-like setting that makes every kind of
// API call the agent has: the informer (list, watch), a Secret and a
// ConfigMap read for cloud-init sources, Events created and (on repeats)
// patched, the seed gate's unpause, and the provisioning annotation patched
// onto a VMI once its guest read the seed, and the launcher pods' watch
// (list + watch of this node's pods, as the agent's run.ts starts it for the
// datasource). libvirt is FakeLibvirt behind the
// real LibvirtInjector with {podUID} templates; images are published into
// launcher "pods" under a temp directory. The fake API server's recorded
// requests are what the RBAC test checks the ClusterRole against.
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeKube, type RequestRecord } from './fake-kube.ts';
import { FakeLibvirt } from './fake-libvirt.ts';
import { startAgent, tempDir, vmi, waitFor, NODE } from './agent-harness.ts';
import { KubeConnectionApi } from '../../src/kube/api-client.ts';
import { kubevirtUnpause } from '../../src/agent/domain/kubevirt-resume.ts';
import { LibvirtInjector, type LibvirtInjectorOptions } from '../../src/libvirt/injector.ts';
import { DirPublisher } from '../../src/libvirt/publish.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { parseTemplate } from '../../src/libvirt/template.ts';
import { FakeClient } from './seed-read-doubles.ts';
import { NodePodWatch } from '../../src/kube/node-pods.ts';
import { BoundedWatch } from '../../src/kube/watch.ts';
import { pino } from 'pino';
import { KubeConnection } from '../../src/kube/connection.ts';
import { startObjectService, type ObjectService } from '../../src/cluster/objects/object-server.ts';
import { testPki } from './test-pki.ts';

// The cluster component's credential in the scenario: its calls are
// recorded as ADMIN_USER's, apart from the node agent's.
const COMPONENT_TOKEN = 'vmseed-cluster-token';
const AGENT_POD = { name: 'vmseed-node-1', uid: '7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e05' };

// The launcher's emptyDir the seed is published into (a `vmseed` directory
// of ours inside it), as the kubelet lays it out under its pods directory.
export const EPHEMERAL = 'volumes/kubernetes.io~empty-dir/ephemeral-disks';
// Launcher pod UIDs (status.activePods keys are pod UIDs).
export const POD_1 = '0b4c2c4e-6f0e-4a4e-9d55-1f1f0c6e1a01';
export const POD_2 = '5d3f1a9e-2b7c-4e8f-a1d2-3c4b5a6f7e02';
export const POD_3 = '9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c03';
const ELSEWHERE = 'e1e1e1e1-e1e1-4e1e-8e1e-e1e1e1e1e1e1';

// paused: started with spec.startStrategy Paused, asking for the seed gate.
export function launcherVmi(
  name: string,
  namespace: string,
  cloudInit: string,
  pod: string,
  extra: { paused?: boolean } = {},
): VmiObject {
  const v = vmi(name, { namespace, cloudInit });
  if (extra.paused) {
    v.metadata.annotations!['vmseed.io/resume-after-seed'] = 'true';
    v.spec.startStrategy = 'Paused';
  }
  v.status = {
    nodeName: NODE,
    phase: 'Running',
    ...(extra.paused ? { conditions: [{ type: 'Paused', status: 'True', reason: 'PausedByUser' }] } : {}),
    // A pod elsewhere is listed too; only this node's counts.
    activePods: { [pod]: NODE, [ELSEWHERE]: 'node-b' },
  };
  return v;
}

// The kubevirt preset's injector, with the pods tree under `pods`.
export function kubevirtInjector(
  pods: string,
  lv: FakeLibvirt,
  resume: LibvirtInjectorOptions['resume'],
): LibvirtInjector {
  return new LibvirtInjector({
    spawner: lv,
    uriTemplate: parseTemplate(
      'uri',
      `qemu+unix:///session?socket=${pods}/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`,
    ),
    imagePathTemplate: parseTemplate('image-path', '/var/run/kubevirt-ephemeral-disks/vmseed/{basename}'),
    publisher: new DirPublisher({
      dirTemplate: parseTemplate('publish-dir', `${pods}/{podUID}/${EPHEMERAL}`),
      subdir: 'vmseed',
    }),
    bus: 'scsi',
    liveOnly: true,
    resume,
    sleep: async () => {},
  });
}

// `namespaces`: the agent in namespaced mode (--namespaces); `rbac`: the
// objects (Roles, bindings...) the fake API server authorises the agent
// with instead of manifests/daemonset.yaml; `objectService`: the agent reads
// Secrets and ConfigMaps and unpauses through the cluster component's
// object service, as the default manifests deploy it (its own calls are
// ADMIN_USER's), with a pod-bound token that names only its pod.
export async function runKubevirtScenario(
  options: { namespaces?: string[]; rbac?: unknown[]; objectService?: boolean } = {},
): Promise<{ requests: RequestRecord[]; unpaused: string[]; lv: FakeLibvirt }> {
  const fake = await FakeKube.start({
    ...(options.rbac ? { rbac: options.rbac } : {}),
    adminTokens: [COMPONENT_TOKEN],
  });
  const dir = await tempDir('vmseed-kubevirt-');
  const pods = join(dir.path, 'pods');
  const connection = fake.connection();
  const api = new KubeConnectionApi(connection, { timeoutMs: 2000 });
  const lv = new FakeLibvirt();
  let service: ObjectService | undefined;
  let objects: KubeConnection | undefined;
  const upstream = fake.connection(COMPONENT_TOKEN);
  try {
    if (options.objectService) {
      const pki = await testPki('vmseed-objects');
      service = await startObjectService({
        listen: { host: '127.0.0.1', port: 0 },
        tls: { cert: pki.serverCert, key: pki.serverKey },
        connection: upstream,
        api: new KubeConnectionApi(upstream, { timeoutMs: 2000 }),
        logger: pino({ level: 'silent' }),
        agentServiceAccount: 'vmseed:vmseed',
      });
      fake.setPod('vmseed', AGENT_POD.name, AGENT_POD.uid, NODE);
      fake.registerReviewToken('node-agent-objects-token', {
        username: 'system:serviceaccount:vmseed:vmseed',
        audiences: ['vmseed-cluster'],
        extra: {
          'authentication.kubernetes.io/pod-name': [AGENT_POD.name],
          'authentication.kubernetes.io/pod-uid': [AGENT_POD.uid],
        },
      });
      objects = new KubeConnection({
        server: `https://127.0.0.1:${service.address.port}`,
        token: 'node-agent-objects-token',
        ca: pki.caCert,
      });
    }
    for (const pod of [POD_1, POD_2]) await mkdir(join(pods, pod, EPHEMERAL), { recursive: true });
    fake.setSecret({
      metadata: { name: 'vm1-userdata', namespace: 'team-a' },
      stringData: { userdata: '#cloud-config\nhostname: vm1\n' },
    });
    fake.setConfigMap({
      metadata: { name: 'vm1-files', namespace: 'team-a' },
      data: { userdata: '#cloud-config\nhostname: files\n' },
    });
    lv.domains.set('team-a_vm1', {
      state: 'paused',
      persistent: true,
      live: [],
      config: [],
      unplugs: true,
      scsi: true,
    });
    lv.domains.set('team-a_files', {
      state: 'running',
      persistent: true,
      live: [],
      config: [],
      unplugs: true,
      scsi: true,
    });
    fake.applyVmi(launcherVmi('vm1', 'team-a', 'secretRef: {name: vm1-userdata}\n', POD_1, { paused: true }));
    fake.applyVmi(
      launcherVmi('files', 'team-a', 'userDataFrom: {kind: configmap, name: vm1-files, key: userdata}\n', POD_2),
    );
    // A Secret that never comes: SeedFailed, then repeats of it (PATCH).
    fake.applyVmi(launcherVmi('broken', 'team-a', 'secretRef: {name: missing}\n', POD_3));
    const unpauseApi = objects ? new KubeConnectionApi(objects, { timeoutMs: 2000 }) : api;
    const injector = kubevirtInjector(pods, lv, kubevirtUnpause(unpauseApi));
    // Every guest reads its seed at once.
    const seedReads = new FakeClient();
    seedReads.reads = 1;
    for (const [name, uid] of [
      ['virt-launcher-vm1', POD_1],
      ['virt-launcher-files', POD_2],
    ])
      fake.setPod('team-a', name, uid, NODE);
    const nodePods = new NodePodWatch({
      api,
      watcher: new BoundedWatch({ connection }),
      nodeName: NODE,
      logger: pino({ level: 'silent' }),
      ...(options.namespaces ? { namespaces: options.namespaces } : {}),
    });
    nodePods.start();
    const h = await startAgent(fake, {
      stateDir: join(dir.path, 'seeds'),
      injector,
      seedReads,
      annotateVmis: { sweepMs: 50 },
      ...(objects ? { objects } : {}),
      ...(options.namespaces ? { namespaces: options.namespaces } : {}),
    });
    try {
      await waitFor('launcher pods listed', () => nodePods.get(POD_1) !== undefined, 20_000);
      await waitFor(
        'launcher pods watched',
        () => fake.requests.some((r) => r.resource === 'pods' && r.verb === 'watch'),
        20_000,
      );
      await waitFor('unpause', () => fake.unpaused.includes('team-a/vm1'), 20_000);
      await waitFor(
        'files seeded',
        () => lv.domains.get('team-a_files')!.live.some((d) => d.alias === 'ua-vmseed_seed'),
        20_000,
      );
      await waitFor(
        'a repeated Event patched',
        () => fake.requests.some((r) => r.resource === 'events' && r.verb === 'patch'),
        20_000,
      );
      await waitFor(
        'a VMI annotated',
        () => fake.requests.some((r) => r.resource === 'virtualmachineinstances' && r.verb === 'patch'),
        20_000,
      );
    } finally {
      await nodePods.stop();
      await h.stop();
    }
    return { requests: [...fake.requests], unpaused: [...fake.unpaused], lv };
  } finally {
    await objects?.close(100);
    await service?.close();
    await upstream.close(100);
    await connection.close();
    await fake.close();
    await dir.remove();
  }
}
