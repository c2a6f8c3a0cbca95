// SLOW (one Debian boot under TCG, 1-7 min depending on the machine's load):
// the Debian cloud-init guest in a replica KubeVirt launcher (see
// e2e/kubevirt-node.test.ts) applies the seed vmseed itself makes for it.
// The one real guest boot is spent on the shape where a wrong seed costs the
// most: a Cluster API (CAPK) control-plane machine, whose ConfigDrive volume
// and CABPK cloud-config Secret (`## template: jinja`, write_files, the capk
// user, the runcmd that writes the bootstrap sentinel CAPK polls for) are
// adopted by vmseed's webhook; the adopted VMI's seed is rendered by vmseed's
// renderer as the agent renders it, written by its ISO writer into its
// image store, and attached by its injector built from the kubevirt preset,
// run as the DaemonSet's user (uid 107 with group 0, the pods tree at /pods):
// a copy in the launcher's ephemeral-disks, SCSI sdzz at drive target 7,
// live only. The domain is read back with the KubeVirt sync double's own XML
// reader, the guest boots after KubeVirt's unpause, finds the ConfigDrive
// (label config-2) and cloud-init runs the machine's bootstrap to its end;
// KubeVirt's launcher sync stays quiet throughout. Every real shape through
// the real agent, with the quick busybox guest, is in
// e2e/kubevirt-adoption.test.ts; the harness control that proves the Debian
// fixture with a genisoimage seed is in e2e/guest-debian.test.ts.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import pino from 'pino';
import { readFileSync } from 'node:fs';
import { rm, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { createKubeletTree, modeOwner, type KubeletTree } from './support/kubelet-tree.ts';
import { startLauncher, type Launcher } from './support/session-libvirtd.ts';
import { startKubevirtVm } from './support/kubevirt-domain.ts';
import { consoleOf } from './support/replica-seed.ts';
import { agentSeed, injectAsAgent, REPLICA_NODE } from './support/agent-seed.ts';
import { ensureDebianGuest, cloudInitFinished } from './support/guest/debian.ts';
import { waitUntil } from './support/agent-process.ts';
import { KubevirtSync, parseDomainDisks } from '../test/support/kubevirt-sync.ts';
import { applyPatch, certDir, clientPki, patchOf, post, testPki, type Json } from '../test/support/webhook.ts';
import type { SecretObject, VmiObject } from '../src/api/objects.ts';
import { serialMinter } from '../src/commands/cluster/webhook.ts';
import { startWebhookServer } from '../src/cluster/webhook/webhook-server.ts';
import { ADOPTED_ANNOTATION } from '../src/cloudinit/kubevirt/adopted.ts';
import { MemoryResolver } from '../src/cloudinit/refs/memory-resolver.ts';

const NS = 'team-a';
const NAME = 'vm-debian';
const CAPK = JSON.parse(
  readFileSync(new URL('../test/fixtures/adoption/capk-controlplane.json', import.meta.url), 'utf8'),
) as {
  vmi: Json;
  secrets: SecretObject[];
};
const SENTINEL = "'true  && echo success > /run/cluster-api/bootstrap-success.complete'";

// CAPK's <machine>-userdata Secret for this VMI: CABPK's cloud-config as CAPK
// re-marshals it, `kubeadm init` replaced by `true` (no control plane here)
// and the test's lines before the sentinel, which stays the last command.
function capkSecret(extraRuncmd: string[]): SecretObject {
  const fixture = CAPK.secrets[0];
  const text = Buffer.from(fixture.data!.userdata, 'base64').toString('utf8');
  const kubeadm =
    "    - 'kubeadm init --config /run/kubeadm/kubeadm.yaml  && echo success > /run/cluster-api/bootstrap-success.complete'\n";
  assert.ok(text.includes(kubeadm), "the fixture's runcmd");
  const userData = text.replace(kubeadm, [...extraRuncmd, SENTINEL].map((l) => `    - ${l}\n`).join(''));
  return {
    ...fixture,
    metadata: { ...fixture.metadata, name: `${NAME}-userdata`, namespace: NS },
    data: { userdata: Buffer.from(userData).toString('base64') },
  };
}

// The CAPK machine's VMI as it reaches admission, here in NS as NAME.
function capkVmi(): Json {
  const vmi = structuredClone(CAPK.vmi);
  vmi.metadata.name = NAME;
  vmi.metadata.namespace = NS;
  vmi.metadata.annotations = { ...vmi.metadata.annotations, 'vmseed.io/adopt': 'true' };
  const volume = (vmi.spec.volumes as Json[]).find((v) => v.cloudInitConfigDrive)!;
  volume.cloudInitConfigDrive.secretRef.name = `${NAME}-userdata`;
  return vmi;
}

// The VMI through vmseed's webhook, the patch applied with Kubernetes' JSON
// Patch. The review comes with the API server's client certificate
// (--webhook-client-ca), which lets the webhook read the Secret.
async function adopted(vmi: Json, secret: SecretObject): Promise<Json> {
  const pki = await testPki('webhook');
  const dir = await certDir(pki);
  const client = await clientPki('vmseed-webhook-client-ca', ['kube-apiserver']);
  await writeFile(join(dir, 'client-ca.crt'), client.caCert);
  const server = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: dir,
    clientAuth: { caFile: join(dir, 'client-ca.crt') },
    logger: pino({ level: 'silent' }),
    mutate: { serials: serialMinter('http://169.254.169.254/v1', 'nocloud-net') },
    adoption: { secrets: new MemoryResolver({ secrets: [secret] }) },
  });
  try {
    const review = {
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      request: {
        uid: randomUUID(),
        kind: { group: 'kubevirt.io', version: 'v1', kind: 'VirtualMachineInstance' },
        resource: { group: 'kubevirt.io', version: 'v1', resource: 'virtualmachineinstances' },
        namespace: NS,
        operation: 'CREATE',
        object: vmi,
      },
    };
    const answer = await post(server.address.port, pki.caCert, JSON.stringify(review), {
      identity: client.clients['kube-apiserver'],
    });
    const patch = patchOf(answer);
    assert.ok(patch, `not adopted: ${JSON.stringify(answer.json?.response?.warnings)}`);
    return await applyPatch(vmi, patch);
  } finally {
    await server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

let tree: KubeletTree;
let launchers: Launcher[] = [];

before(async () => {
  await ensureDebianGuest();
  tree = await createKubeletTree(1);
  launchers = await Promise.all(tree.pods.map((p) => startLauncher(p)));
});

after(async () => {
  await Promise.allSettled(launchers.map((l) => l.stop()));
  await tree?.remove();
});

test(
  "SLOW: a Debian guest in the launcher bootstraps a CAPK machine from the ConfigDrive vmseed's webhook adopted, seeded by vmseed's renderer and injector as the agent, after KubeVirt's unpause",
  { timeout: 720_000 },
  async (t) => {
    const [b] = launchers;
    const uid = randomUUID();
    const vm = await startKubevirtVm(b, {
      namespace: NS,
      name: NAME,
      uuid: uid,
      cmdline: (await ensureDebianGuest()).cmdline,
      guest: 'debian',
    });
    t.after(async () => {
      await b.virsh(['destroy', vm.domain]).catch(() => {});
      await b.virsh(['undefine', vm.domain]).catch(() => {});
    });
    const kubevirt = new KubevirtSync({
      domain: vm.domain,
      virsh: b.virsh,
      spec: vm.spec,
      diskReady: b.diskReady,
      startPaused: true,
    });
    const quiet = { resumed: false, detached: [], attached: [], updated: [], skippedNotReady: [] };
    assert.deepEqual(await kubevirt.sync(), quiet);

    const marker = `VMSEED-RUNCMD-${randomUUID().slice(0, 8)}`;
    // The marker names what is in /run/cluster-api, where the sentinel goes.
    const secret = capkSecret([`echo ${marker} $(ls /run/cluster-api)`, 'echo "HOST=$(hostname)"']);
    const admitted = await adopted(capkVmi(), secret);
    assert.ok(admitted.metadata.annotations[ADOPTED_ANNOTATION], 'adopted');
    assert.ok(!(admitted.spec.volumes as Json[]).some((v) => v.cloudInitConfigDrive), 'the volume moved');
    assert.equal(admitted.spec.startStrategy, 'Paused');
    // As KubeVirt then reports it: running paused in launcher B.
    const vmi = {
      ...admitted,
      metadata: { ...admitted.metadata, uid },
      spec: {
        ...admitted.spec,
        domain: { ...admitted.spec.domain, firmware: { ...admitted.spec.domain.firmware, uuid: uid } },
      },
      status: { nodeName: REPLICA_NODE, phase: 'Running', activePods: { [b.pod.uid]: REPLICA_NODE } },
    } as VmiObject;
    const image = await agentSeed(vmi, new MemoryResolver({ secrets: [secret] }));
    t.after(() => image.cleanup());
    assert.equal(image.seed.datasource, 'configdrive');
    const r = await injectAsAgent(tree, vmi, image.path, 'configdrive');
    assert.deepEqual(
      [r.action, r.domain, r.bus, r.targetDev, r.flags, r.domainState, r.resumed],
      ['attached', vm.domain, 'scsi', 'sdzz', ['--live'], 'paused', false],
    );

    // The copy in the launcher's ephemeral-disks: the store's bytes, the agent's file.
    const copyName = `vmseed-${basename(image.path)}`;
    const copy = join(b.pod.emptyDir('ephemeral-disks'), 'vmseed', copyName);
    assert.equal(createHash('sha256').update(readFileSync(copy)).digest('hex'), image.sha256);
    assert.equal((await modeOwner(copy)).uid, 107);
    const seedPath = `/var/run/kubevirt-ephemeral-disks/vmseed/${copyName}`;
    const live = parseDomainDisks(await b.virsh(['dumpxml', vm.domain]));
    const seed = live.find((d) => d.alias === 'ua-vmseed_seed');
    assert.deepEqual(
      [seed?.sourceFile, seed?.bus, seed?.targetDev, seed?.readonly, seed?.address],
      [seedPath, 'scsi', 'sdzz', true, { type: 'drive', controller: '0', bus: '0', target: '7', unit: '0' }],
    );
    const config = parseDomainDisks(await b.virsh(['dumpxml', '--inactive', vm.domain]));
    assert.ok(!config.some((d) => d.alias === 'ua-vmseed_seed'), 'live only: not in the persistent definition');
    for (let i = 0; i < 2; i++) assert.deepEqual(await kubevirt.sync(), quiet);

    await kubevirt.unpause();
    const started = Date.now();
    const con = await waitUntil(
      'cloud-init to finish',
      () => {
        const text = consoleOf(b, vm);
        return cloudInitFinished(text) ? text : undefined;
      },
      600_000,
      () => consoleOf(b, vm).slice(-3000),
    );
    console.log(`# Debian guest: cloud-init finished ${((Date.now() - started) / 1000).toFixed(1)} s after unpause`);
    assert.match(
      con,
      /Datasource DataSourceConfigDrive \[[^\]]*\]\[source=\/dev\/sd[a-z]+\]/,
      'ConfigDrive from the SCSI seed',
    );
    assert.match(
      con,
      new RegExp(`cloud-init\\[\\d+\\]: ${marker} placeholder\\r?$`, 'm'),
      'runcmd ran after write_files made /run/cluster-api',
    );
    assert.match(con, new RegExp(`cloud-init\\[\\d+\\]: HOST=${NAME}\\r?$`, 'm'), "the meta-data's hostname");
    // The sentinel is the runcmd script's last command, so its status is the
    // script's: cloud-init says when scripts-user fails.
    assert.deepEqual(
      con.split('\n').filter((l) => /scripts[-_]user|instance\/scripts\/runcmd: /.test(l)),
      [],
      'the bootstrap sentinel written',
    );
    for (let i = 0; i < 2; i++) assert.deepEqual(await kubevirt.sync(), quiet);
    assert.deepEqual(kubevirt.errors(), []);
  },
);
