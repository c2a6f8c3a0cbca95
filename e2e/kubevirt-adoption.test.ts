// Adoption of KubeVirt cloud-init volumes, end to end on the replica node:
// the unit tests (test/cluster/webhook/adoption.test.ts) show the webhook's
// patch and the render agree in one process; only here do the pieces that
// ship meet as they run in a cluster, so a gap between them (a field the
// patch moves that the agent does not read back, a label or file path the
// guest does not look for) shows up as a guest that finds no seed.
// - `vmseed cluster` runs as a process with the args the webhook variant
//   (deploy/webhook) gives it, only its listeners, certificate directory and
//   API connection overridden (its object service is left out: the agent
//   reaches the in-process one, as in e2e/kubevirt-node-agent.test.ts); it
//   reads the shapes' Secrets from the TLS fake API server with its own
//   service account under the variant's RBAC;
// - four real shapes (test/fixtures/adoption) are admitted, Cluster API's,
//   virtctl's and a KubeVirt example through the VMI's own opt-in,
//   Harvester's through its namespace's label, and each patch applied with
//   Kubernetes' JSON Patch; the result, placed in a launcher pod of the
//   replica, is what the fake API server serves;
// - one agent, run as the DaemonSet runs it, seeds all of them; each busybox
//   guest looks for the seed by its label (cidata, or config-2 for
//   ConfigDrive) after KubeVirt's unpause and must read exactly the files
//   KubeVirt would have built from the VMI as submitted.
// One agent and the guests side by side keep this file's time small.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createKubeletTree, runCommand, QEMU_GID, QEMU_UID, type KubeletTree } from './support/kubelet-tree.ts';
import { startLauncher, type Launcher } from './support/session-libvirtd.ts';
import { startKubevirtVm } from './support/kubevirt-domain.ts';
import { consoleOf } from './support/replica-seed.ts';
import { listenerUrls, LOOPBACK_LISTENERS, startDaemonSetAgent, waitHealthy } from './support/daemonset-agent.ts';
import { busyboxCmdline } from './support/guest/busybox.ts';
import { parseConsole } from './support/guest/console.ts';
import { waitUntil } from './support/agent-process.ts';
import { FakeKube } from '../test/support/fake-kube.ts';
import { resourceType } from '../test/support/fake-kube-objects.ts';
import { startClusterObjects } from '../test/support/cluster-objects.ts';
import { serviceAccountVolume } from '../test/support/in-cluster.ts';
import { startCliCluster } from '../test/support/cluster-cli.ts';
import { kustomize } from '../test/support/kustomize.ts';
import { findObject } from '../test/support/manifests.ts';
import { applyPatch, certDir, patchOf, post, testPki, type Json } from '../test/support/webhook.ts';
import { KubevirtSync, parseDomainDisks } from '../test/support/kubevirt-sync.ts';
import type { SecretObject, VmiObject } from '../src/api/objects.ts';
import { ADOPT_PATH, WEBHOOK_PATH } from '../src/cluster/webhook/webhook-server.ts';
import { ADOPTED_ANNOTATION, readAdopted } from '../src/cloudinit/kubevirt/adopted.ts';
import { MemoryResolver } from '../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../src/cloudinit/render.ts';
import { LABELS, seedFiles } from '../src/disk/seed-image.ts';

const ROOT = new URL('../', import.meta.url).pathname;
const NODE = 'replica-node';

// How each shape asks: its own annotation, or its namespace's label (the
// configuration's second webhook, on its own path).
const SHAPES = [
  { name: 'capk-controlplane', path: WEBHOOK_PATH },
  { name: 'harvester', path: ADOPT_PATH },
  { name: 'virtctl', path: WEBHOOK_PATH },
  { name: 'kubevirt-example-vmi-masquerade', path: WEBHOOK_PATH },
] as const;

interface Shape {
  name: string;
  path: string;
  vmi: Json;
  secrets: SecretObject[];
}

const shapes: Shape[] = SHAPES.map((s) => {
  const doc = JSON.parse(readFileSync(join(ROOT, 'test/fixtures/adoption', `${s.name}.json`), 'utf8')) as Json;
  const vmi = structuredClone(doc.vmi) as Json;
  if (s.path === WEBHOOK_PATH)
    vmi.metadata.annotations = { ...(vmi.metadata.annotations ?? {}), 'vmseed.io/adopt': 'true' };
  return { ...s, vmi, secrets: (doc.secrets ?? []) as SecretObject[] };
});

let tree: KubeletTree;
let launchers: Launcher[] = [];

before(async () => {
  tree = await createKubeletTree(shapes.length);
  launchers = await Promise.all(tree.pods.map((p) => startLauncher(p)));
});

after(async () => {
  await Promise.allSettled(launchers.map((l) => l.stop()));
  await tree?.remove();
});

// `vmseed cluster`'s args in the webhook variant, less what this test
// replaces: the listeners and certificate directory (startCliCluster and the
// caller give theirs) and the object service's flags.
function clusterArgs(objects: unknown[]): string[] {
  const deployment = findObject(objects as never, 'Deployment', 'vmseed-cluster') as Json;
  const container = (deployment.spec.template.spec.containers as Json[]).find((c) => c.name === 'cluster')!;
  const args = container.args as string[];
  assert.ok(
    args.some((a) => a.startsWith('--webhook-listen=') && a !== '--webhook-listen=off'),
    'the webhook variant turns the webhook on',
  );
  return args.filter((a) => !/^--(webhook-listen|probe-listen|webhook-cert-dir|objects-[a-z-]+)=/.test(a));
}

function review(vmi: Json): string {
  return JSON.stringify({
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid: randomUUID(),
      kind: { group: 'kubevirt.io', version: 'v1', kind: 'VirtualMachineInstance' },
      resource: { group: 'kubevirt.io', version: 'v1', resource: 'virtualmachineinstances' },
      namespace: vmi.metadata.namespace,
      operation: 'CREATE',
      object: vmi,
    },
  });
}

// The VMI as KubeVirt then reports it: its uid, its firmware UUID (KubeVirt's
// mutator sets one where the VM controller did not), running paused in the
// launcher pod `pod` of the replica node.
function running(vmi: Json, uid: string, firmwareUuid: string, pod: string): VmiObject {
  const o = structuredClone(vmi);
  o.metadata.uid = uid;
  o.metadata.labels = { ...(o.metadata.labels ?? {}), 'kubevirt.io/nodeName': NODE };
  o.spec.domain.firmware = { ...(o.spec.domain.firmware ?? {}), uuid: firmwareUuid };
  o.status = {
    ...(o.status ?? {}),
    nodeName: NODE,
    phase: 'Running',
    conditions: [{ type: 'Paused', status: 'True', reason: 'PausedByUser' }],
    activePods: { [pod]: NODE },
  };
  return o as VmiObject;
}

// The shape's namespace (labelled vmseed.io/adopt=true where the namespace
// asks) and the VirtualMachine that made its VMI (the controller
// ownerReference), with the VMI's metadata and spec as its template, in the
// fake API server; the reference then names the UID the server gave it.
function vouchedBy(fake: FakeKube, s: Shape): void {
  const vmi = s.vmi;
  const namespace = vmi.metadata.namespace as string;
  if (!fake.objects.namespaceExists(namespace)) {
    const labels = s.path === ADOPT_PATH ? { 'vmseed.io/adopt': 'true' } : {};
    fake.objects.create(
      resourceType('', 'namespaces')!,
      undefined,
      JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: namespace, labels } }),
    );
  }
  const owner = (vmi.metadata.ownerReferences as Json[] | undefined)?.find((o) => o.kind === 'VirtualMachine');
  if (!owner) return;
  const { 'kubevirt.io/vm-generation': _, ...annotations } = (vmi.metadata.annotations ?? {}) as Record<string, string>;
  const vm = {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachine',
    metadata: { name: owner.name, namespace: vmi.metadata.namespace },
    spec: {
      runStrategy: 'Always',
      template: { metadata: { labels: vmi.metadata.labels ?? {}, annotations }, spec: vmi.spec },
    },
  };
  const created = fake.objects.create(resourceType('kubevirt.io', 'virtualmachines')!, namespace, JSON.stringify(vm));
  assert.equal(created.code, 201, JSON.stringify(created.body));
  owner.uid = (created.body as Json).metadata.uid;
}

function seedImages(l: Launcher): string[] {
  const dir = join(l.pod.emptyDir('ephemeral-disks'), 'vmseed');
  return existsSync(dir) ? readdirSync(dir).filter((f) => !f.startsWith('.')) : [];
}

test(
  "real shapes adopted by `vmseed cluster`'s webhook are seeded by the agent on the replica node; each guest reads at first boot the files KubeVirt would have built",
  { timeout: 300_000 },
  async (t) => {
    const variant = await kustomize(join(ROOT, 'deploy', 'webhook'));
    const fake = await FakeKube.start({ rbac: variant });
    t.after(() => fake.close());
    for (const s of shapes) for (const secret of s.secrets) fake.setSecret(secret);
    // The VirtualMachines the VM-made shapes come from: without a client CA
    // (the variant sets none) a VMI's VM vouches for its review.
    for (const s of shapes) vouchedBy(fake, s);
    const work = await mkdtemp(join(tmpdir(), 'vmseed-kv-adoption-'));
    t.after(() => rm(work, { recursive: true, force: true }));

    // The cluster component with the webhook on, its certificate as
    // cert-manager would mount it, its service account's kubeconfig.
    const pki = await testPki('webhook');
    const tls = join(work, 'webhook-tls');
    await mkdir(tls);
    await certDir(pki, tls);
    const kubeconfig = await fake.writeKubeconfig(work, fake.serviceAccountToken('vmseed', 'vmseed-cluster'));
    const cluster = startCliCluster([
      ...clusterArgs(variant),
      `--webhook-cert-dir=${tls}`,
      `--kubeconfig=${kubeconfig}`,
    ]);
    t.after(() => cluster.stop());
    const webhookPort = await cluster.webhookPort();
    await waitUntil(
      'the webhook ready',
      async () => (await fetch(`${await cluster.probeUrl()}/readyz`).catch(() => undefined))?.status === 200,
      60_000,
      async () => cluster.output().slice(-2000),
    );

    // 1. Admission: each shape adopted, the patch applied as the API server applies it.
    const vms = await Promise.all(
      shapes.map(async (s, i) => {
        const answer = await post(webhookPort, pki.caCert, review(s.vmi), { path: s.path });
        assert.equal(answer.status, 200, answer.body);
        const warnings = (answer.json!.response.warnings ?? []) as string[];
        const patch = patchOf(answer);
        assert.ok(patch, `${s.name}: not adopted: ${warnings.join(' | ')}`);
        assert.ok(!warnings.some((w) => w.startsWith('ADOPTION_SKIPPED')), `${s.name}: ${warnings.join(' | ')}`);
        const adopted = await applyPatch(s.vmi, patch);
        const volume = (s.vmi.spec.volumes as Json[]).find((v) => v.cloudInitNoCloud || v.cloudInitConfigDrive)!;
        assert.ok(
          !(adopted.spec.volumes as Json[]).some((v) => v.cloudInitNoCloud || v.cloudInitConfigDrive),
          `${s.name}: the volume is gone`,
        );
        assert.ok(
          !(adopted.spec.domain.devices.disks as Json[]).some((d) => d.name === volume.name),
          `${s.name}: its disk is gone`,
        );
        const record = readAdopted(adopted.metadata.annotations[ADOPTED_ANNOTATION] as string);
        assert.deepEqual(record.volume, volume, s.name);
        assert.equal(record.by, s.path === ADOPT_PATH ? 'namespace' : 'annotation', s.name);
        assert.equal(adopted.spec.startStrategy, 'Paused', s.name);
        assert.equal(adopted.metadata.annotations['vmseed.io/resume-after-seed'], 'true', s.name);

        const launcher = launchers[i];
        const uid = randomUUID();
        const firmwareUuid = (s.vmi.spec.domain.firmware?.uuid as string | undefined) ?? randomUUID();
        // What KubeVirt would have built: the VMI as submitted, as KubeVirt sees it.
        const asSubmitted = running(s.vmi, uid, firmwareUuid, launcher.pod.uid);
        const render = async (context: { reportUrl?: string }) => {
          const outcome = await renderSeed(
            asSubmitted,
            new MemoryResolver({ secrets: s.secrets }),
            { ...DEFAULT_RENDER_OPTIONS, kubevirtVolumes: 'own' },
            context,
          );
          assert.equal(outcome.kind, 'seed', `${s.name}: ${outcome.kind === 'skip' ? outcome.reason : ''}`);
          return outcome.seed;
        };
        const seed = await render({});
        const files = seedFiles(seed).map((f) => ({ path: f.path, data: Buffer.from(f.data) }));
        // The agent adds one file of its own: the vendor-data that has
        // cloud-init report its progress (userdata/reporting-config.ts).
        const withReport = seedFiles(await render({ reportUrl: 'http://report.invalid/' })).map((f) => f.path);
        const reportFiles = withReport.filter((p) => !files.some((f) => f.path === p));
        assert.ok(
          reportFiles.length > 0 && reportFiles.every((p) => /vendor[-_]data/.test(p)),
          `${s.name}: ${reportFiles.join(' ')}`,
        );
        const label = LABELS[seed.datasource];
        assert.equal(label, volume.cloudInitConfigDrive ? 'config-2' : 'cidata', s.name);

        const vm = await startKubevirtVm(launcher, {
          namespace: adopted.metadata.namespace as string,
          name: adopted.metadata.name as string,
          uuid: firmwareUuid,
          cmdline: busyboxCmdline({ label, files: withReport, waitSeconds: 120, after: 'stay' }),
        });
        t.after(async () => {
          await launcher.virsh(['destroy', vm.domain]).catch(() => {});
          await launcher.virsh(['undefine', vm.domain]).catch(() => {});
        });
        const kubevirt = new KubevirtSync({
          domain: vm.domain,
          virsh: launcher.virsh,
          spec: vm.spec,
          diskReady: launcher.diskReady,
          startPaused: true,
        });
        return {
          shape: s,
          launcher,
          vm,
          kubevirt,
          files,
          reportFiles,
          withReport,
          label,
          vmi: running(adopted, uid, firmwareUuid, launcher.pod.uid),
        };
      }),
    );
    fake.onUnpause(async (namespace, name) => {
      const v = vms.find((x) => x.vm.namespace === namespace && x.vm.name === name);
      if (v) await v.kubevirt.unpause();
    });
    for (const v of vms) fake.applyVmi(v.vmi);

    // 2. One agent, as the DaemonSet runs it, for all of them.
    const stateDir = join(work, 'seeds');
    await runCommand(['install', '-d', '-o', String(QEMU_UID), '-g', String(QEMU_GID), '-m', '0755', stateDir]);
    const objects = await startClusterObjects(fake, NODE);
    t.after(() => objects.close());
    const keyDir = join(work, 'datasource-key');
    await mkdir(keyDir, { mode: 0o755 });
    await writeFile(join(keyDir, 'keys'), `${randomBytes(32).toString('base64')}\n`, { mode: 0o444 });
    await chmod(work, 0o755);
    const agent = await startDaemonSetAgent({
      hostPaths: {
        '/var/lib/kubelet/pods': tree.podsDir,
        '/var/lib/vmseed/seeds': stateDir,
        '/var/lib/vmseed/keys': keyDir,
      },
      volumeDirs: objects.volumeDirs,
      nodeName: NODE,
      kube: { inCluster: { host: '127.0.0.1', port: fake.port, saDir: (await serviceAccountVolume(fake, work)).path } },
      overrides: { ...LOOPBACK_LISTENERS, ...objects.overrides },
    });
    t.after(() => agent.stop());
    const urls = await listenerUrls(agent, 90_000);
    await waitHealthy(agent, `${urls.probes}/healthz`, 60_000);
    const detail = async () => {
      const status = await fetch(`${urls.status}/status.json`)
        .then((r) => r.text())
        .catch((e: unknown) => String(e));
      return `agent log tail:\n${agent.log().split('\n').slice(-30).join('\n')}\nstatus: ${status.slice(0, 3000)}`;
    };

    // 3. Each seeded, unpaused, and read by its guest at first boot.
    await Promise.all(
      vms.map(async ({ shape, launcher, vm, kubevirt, files, reportFiles, withReport, label }) => {
        const attached = await waitUntil(
          `${shape.name}: the seed attached`,
          async () => {
            if (agent.exited()) throw new Error(`the agent exited: ${await detail()}`);
            return parseDomainDisks(await launcher.virsh(['dumpxml', vm.domain])).find(
              (d) => d.alias === 'ua-vmseed_seed',
            );
          },
          90_000,
          detail,
        );
        const [image] = seedImages(launcher);
        assert.ok(image && attached.sourceFile?.endsWith(`/${image}`), `${shape.name}: ${attached.sourceFile}`);
        const iso = join(launcher.pod.emptyDir('ephemeral-disks'), 'vmseed', image);
        assert.match(
          execFileSync('isoinfo', ['-d', '-i', iso], { encoding: 'utf8' }),
          new RegExp(`^Volume id: ${label}$`, 'm'),
          `${shape.name}: the volume label`,
        );
        const inIso = execFileSync('bsdtar', ['-tf', iso], { encoding: 'utf8' })
          .split('\n')
          .map((p) => p.replace(/^\.\//, ''))
          .filter((p, _, all) => p !== '' && p !== '.' && !all.some((q) => q.startsWith(`${p}/`)))
          .sort();
        assert.deepEqual(inIso, [...withReport].sort(), `${shape.name}: the image's files`);
        await waitUntil(
          `${shape.name}: unpaused`,
          () => fake.unpaused.includes(`${vm.namespace}/${vm.name}`),
          60_000,
          detail,
        );
        const seen = await waitUntil(
          `${shape.name}: the guest to print the seed`,
          () => {
            const c = parseConsole(consoleOf(launcher, vm));
            return c.done || c.labelTimeout ? c : undefined;
          },
          150_000,
          () => consoleOf(launcher, vm).split('\n').slice(-15).join('\n'),
        );
        assert.equal(seen.labelTimeout, false, `${shape.name}: no ${label} disk seen`);
        assert.deepEqual(seen.missing, [], shape.name);
        for (const f of files)
          assert.equal(
            seen.files.get(f.path)?.toString('utf8'),
            f.data.toString('utf8'),
            `${shape.name}: ${f.path} as KubeVirt would write it`,
          );
        for (const p of reportFiles)
          assert.match(seen.files.get(p)?.toString('utf8') ?? '', /reporting:(\n|\\n)/, `${shape.name}: ${p}`);
        const quiet = await kubevirt.sync();
        assert.deepEqual([quiet.error, quiet.detached, quiet.resumed], [undefined, [], false], shape.name);
      }),
    );

    assert.deepEqual(
      fake.requests
        .filter((r) => r.resource === 'virtualmachines' && r.verb === 'get' && r.status === 200)
        .map((r) => r.path)
        .sort(),
      shapes
        .filter((s) => s.vmi.metadata.ownerReferences && s.secrets.length > 0)
        .map(
          (s) => `/apis/kubevirt.io/v1/namespaces/${s.vmi.metadata.namespace}/virtualmachines/${s.vmi.metadata.name}`,
        )
        .sort(),
      'each VM-made VMI whose Secret is read vouched for by its VirtualMachine',
    );
    assert.deepEqual(
      fake.requests.filter((r) => r.status === 401 || r.status === 403).map((r) => `${r.status} ${r.method} ${r.path}`),
      [],
      "the variant's RBAC grants all the agent and the webhook ask",
    );
    // Normal starts: no adoption skipped, and no warning at all (CABPK's
    // jinja template is rendered in the guest, which is no problem).
    assert.deepEqual(
      fake
        .events()
        .filter((e) => e.type !== 'Normal')
        .map((e) => `${e.involvedObject.name} ${e.reason}: ${e.message.split(':')[0]}`),
      [],
      'Warning Events',
    );
    assert.equal(await agent.stop(), 0);
    assert.equal(await cluster.stop(), 0);
    assert.doesNotMatch(cluster.output(), /"level":(50|60)/, 'nothing logged as an error by the webhook');
  },
);
