// The serial the webhook writes, followed to the seed: the real webhook
// answers AdmissionReviews, Kubernetes' JSON Patch applies them, the agent's
// seed directory holds the admitted VMIs (with the UIDs the API server would
// give them and their launcher pods on this node, each a 127.0.0.x source
// address) and the real datasource serves them by the token in the serial.
//  - The webhook holds no key: each serial carries a fresh random token, and
//    the agent opens a VMI to the token in that VMI's own spec, from its
//    launcher pod only. A VM's next VMI (a restart) is seeded by its own
//    serial; the old one opens nothing any more.
//  - A VMI re-created later (a VM re-created under the same name, a copied
//    manifest with the old serial) gets a new token; the old opens nothing.
//  - A forged AdmissionReview, whatever it names, yields a token that opens
//    nothing: the real VMI has its own serial.
//  - A neighbour carrying a copy of a VMI's serial neither denies that VMI
//    nor gets anything of it.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { rm } from 'node:fs/promises';
import pino from 'pino';
import { AgentSeedDirectory } from '../../../src/datasource/directory.ts';
import { serialMinter } from '../../../src/commands/cluster/webhook.ts';
import { startDatasourceServer, type DatasourceServer } from '../../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../../src/datasource/tokens.ts';
import { startWebhookServer, type WebhookServer } from '../../../src/cluster/webhook/webhook-server.ts';
import type { NodePod, NodePods } from '../../../src/datasource/types.ts';
import type { VmiObject } from '../../../src/api/objects.ts';
import { nocloudSeed, randomKey } from '../../datasource/datasource-fixtures.ts';
import { get } from '../../datasource/imds-support.ts';
import { applyPatch, certDir, fixtureReview, patchOf, post, testPki, type Json } from '../../support/webhook.ts';

const NODE = 'node-a';
// Where a namespace viewer (or anyone off this node's launchers) runs curl.
const VIEWER = '127.0.0.50';

class FakePods implements NodePods {
  readonly pods = new Map<string, NodePod>();
  revision = 0;
  get(uid: string): NodePod | undefined {
    return this.pods.get(uid);
  }
  add(pod: NodePod): void {
    this.pods.set(pod.uid, pod);
    this.revision++;
  }
}

const logger = pino({ level: 'silent' });
// The node's own key: UID tokens only, the webhook never sees it.
const keyring = new DatasourceKeyring([randomKey()]);
const pods = new FakePods();
const directory = new AgentSeedDirectory({ onFetch: () => undefined, nodeName: NODE, pods });
let webhook: WebhookServer;
let datasource: DatasourceServer;
let ca: string;
let tls: string;
let nextIp = 20;

before(async () => {
  const pki = await testPki('webhook');
  ca = pki.caCert;
  tls = await certDir(pki);
  datasource = await startDatasourceServer({ listen: { host: '127.0.0.1', port: 0 }, directory, keyring, logger });
  webhook = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: tls,
    logger,
    // The serial points at this test's datasource; no key is given.
    mutate: { serials: serialMinter(datasource.baseUrl, 'nocloud') },
  });
});

after(async () => {
  await webhook?.close();
  await datasource?.close();
  if (tls) await rm(tls, { recursive: true, force: true });
});

// What the webhook answers for `object` in `review`, applied.
async function admitted(review: Json, object: Json): Promise<VmiObject> {
  const r = structuredClone(review);
  r.request.uid = randomUUID();
  r.request.object = object;
  const patch = patchOf(await post(webhook.address.port, ca, JSON.stringify(r))) ?? [];
  const vmi = (await applyPatch(object, patch)) as VmiObject;
  vmi.metadata.namespace = r.request.namespace as string;
  return vmi;
}

// Runs `vmi` on this node as the API server and KubeVirt would: a fresh UID,
// a launcher pod of its own at a fresh address, seeded with `seedName`'s
// seed. Returns the launcher's address.
function run(vmi: VmiObject, seedName: string): string {
  vmi.metadata.uid = randomUUID();
  const pod = randomUUID();
  const ip = `127.0.0.${nextIp++}`;
  pods.add({
    uid: pod,
    name: `virt-launcher-${seedName}`,
    namespace: vmi.metadata.namespace!,
    owners: [vmi.metadata.uid],
    ips: [ip],
  });
  vmi.status = { nodeName: NODE, phase: 'Running', activePods: { [pod]: NODE } };
  directory.put(`${vmi.metadata.namespace}/${vmi.metadata.name}`, vmi, nocloudSeed(seedName));
  return ip;
}

async function admit(review: Json, object: Json, seedName: string): Promise<{ vmi: VmiObject; ip: string }> {
  const vmi = await admitted(review, object);
  return { vmi, ip: run(vmi, seedName) };
}

function tokenOf(vmi: VmiObject): string {
  const serial = vmi.spec.domain!.firmware!.serial!;
  const m = /^ds=nocloud;s=http:\/\/[^;]+\/([A-Za-z0-9_-]{43})\/$/.exec(serial);
  assert.ok(m, serial);
  return m[1];
}

async function userData(token: string, from: string): Promise<string | undefined> {
  const res = await get(datasource.address.port, `/v1/${token}/user-data`, {}, from);
  return res.status === 200 ? res.body : undefined;
}

test("a VM's next VMI is seeded by its own serial; the old serial opens nothing, nor does it open the VM re-created under the same name", async () => {
  const review = await fixtureReview('vmi-from-vm');
  const template: Json = review.request.object;
  const first = await admit(review, structuredClone(template), 'boot-1');
  const old = tokenOf(first.vmi);
  assert.match((await userData(old, first.ip))!, /secret-of-boot-1/);

  // Restart: KubeVirt deletes the VMI and creates a new one from the VM.
  directory.drop('default/vm-cirros');
  assert.equal(await userData(old, first.ip), undefined, 'no VMI, no seed');
  const second = await admit(review, structuredClone(template), 'boot-2');
  assert.notEqual(tokenOf(second.vmi), old, 'a fresh token');
  assert.match((await userData(tokenOf(second.vmi), second.ip))!, /secret-of-boot-2/, 'the new VMI is seeded');
  assert.equal(await userData(old, second.ip), undefined, 'the old token opens nothing of it');

  // The VM is deleted; someone else creates a VM of the same name.
  directory.drop('default/vm-cirros');
  const other = structuredClone(template);
  other.metadata.ownerReferences[0].uid = randomUUID();
  const third = await admit(review, other, 'someone-else');
  for (const t of [old, tokenOf(second.vmi)])
    assert.equal(await userData(t, third.ip), undefined, "an old token opens nothing of the new owner's VM");
  assert.match((await userData(tokenOf(third.vmi), third.ip))!, /secret-of-someone-else/);
  directory.drop('default/vm-cirros');
});

test('a VMI re-created from its exported manifest (our serial in it) gets a fresh serial; the old token opens nothing', async () => {
  const review = await fixtureReview('vmi-direct');
  const first = await admit(review, structuredClone(review.request.object), 'direct-1');
  const old = tokenOf(first.vmi);
  assert.match((await userData(old, first.ip))!, /secret-of-direct-1/);
  directory.drop('tenant-a/vmi-nocloud');
  const copy = structuredClone(first.vmi) as Json;
  delete copy.metadata.uid;
  delete copy.status;
  const second = await admit(review, copy, 'direct-2');
  assert.notEqual(tokenOf(second.vmi), old);
  assert.equal(await userData(old, second.ip), undefined);
  assert.match((await userData(tokenOf(second.vmi), second.ip))!, /secret-of-direct-2/);
  directory.drop('tenant-a/vmi-nocloud');
});

test('a forged AdmissionReview naming a running VMI (namespace, name, owner, its serial) yields a token that opens nothing, from anywhere', async () => {
  const review = await fixtureReview('vmi-from-vm');
  const real = await admit(review, structuredClone(review.request.object), 'real');
  assert.match((await userData(tokenOf(real.vmi), real.ip))!, /secret-of-real/);
  const forgeries: Json[] = [
    structuredClone(review.request.object),
    { ...structuredClone(real.vmi), status: undefined },
    (() => {
      const o = structuredClone(review.request.object);
      o.metadata.ownerReferences = [];
      return o;
    })(),
  ];
  for (const forged of forgeries) {
    const got = await admitted(review, forged);
    const token = tokenOf(got);
    assert.notEqual(token, tokenOf(real.vmi));
    for (const from of [real.ip, VIEWER, '127.0.0.1'])
      assert.equal(await userData(token, from), undefined, `from ${from}`);
  }
  assert.match((await userData(tokenOf(real.vmi), real.ip))!, /secret-of-real/, 'the real VMI is still served');
  directory.drop('default/vm-cirros');
});

test("a neighbour carrying a copy of a VMI's serial neither denies it nor gets anything of it; from elsewhere the token opens nothing", async () => {
  const review = await fixtureReview('vmi-direct');
  const victim = await admit(review, structuredClone(review.request.object), 'victim');
  const token = tokenOf(victim.vmi);
  // Created past the webhook (or with a base the webhook does not call
  // its own): the copy of the victim's serial stays in the thief's spec.
  const thief = structuredClone(victim.vmi);
  thief.metadata.name = 'thief';
  const thiefIp = run(thief, 'thief');
  assert.equal(tokenOf(thief), token);
  assert.match((await userData(token, victim.ip))!, /secret-of-victim/, 'the victim is still served');
  // From its own launcher the copied token opens the thief's own VMI (it
  // is in the thief's spec), never the victim's.
  assert.match((await userData(token, thiefIp))!, /secret-of-thief/);
  assert.equal(await userData(token, VIEWER), undefined, 'a viewer gets nothing');
  directory.drop('tenant-a/thief');
  assert.match((await userData(token, victim.ip))!, /secret-of-victim/);
  directory.drop('tenant-a/vmi-nocloud');
});

test("the UID token under the node's own key (vmseed seed-url --uid) still opens its VMI, from its launcher only", async () => {
  const review = await fixtureReview('vmi-direct');
  const { vmi, ip } = await admit(review, structuredClone(review.request.object), 'by-uid');
  const token = keyring.sign(vmi.metadata.uid!);
  assert.match((await userData(token, ip))!, /secret-of-by-uid/);
  assert.equal(await userData(token, VIEWER), undefined);
  directory.drop('tenant-a/vmi-nocloud');
});
