// The serial the webhook writes, followed to the seed: the real webhook
// answers AdmissionReviews, Kubernetes' JSON Patch applies them, the agent's
// seed directory holds the admitted VMIs (with the UIDs the API server would
// give them) and the real datasource serves them by the token in the serial.
//  - Its identity survives what a VM does: every VMI a VirtualMachine
//    starts gets the same serial, and it opens the current VMI's seed.
//  - It is not reused by a VMI re-created later by someone else: a VM
//    re-created under the same name (new UID), or a VMI re-created from a
//    copied manifest (old nonce, old serial), gets a new token, and the old
//    token opens nothing of it.
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
import { newNonce } from '../../../src/commands/cluster/webhook.ts';
import { NONCE_ANNOTATION } from '../../../src/datasource/binding.ts';
import type { VmiObject } from '../../../src/api/objects.ts';
import { nocloudSeed, randomKey } from '../../datasource/datasource-fixtures.ts';
import { applyPatch, certDir, fixtureReview, patchOf, post, testPki, type Json } from '../../support/webhook.ts';

const logger = pino({ level: 'silent' });
const keyring = new DatasourceKeyring([randomKey()]);
const directory = new AgentSeedDirectory({ onFetch: () => undefined });
let webhook: WebhookServer;
let datasource: DatasourceServer;
let ca: string;
let tls: string;

before(async () => {
  const pki = await testPki('webhook');
  ca = pki.caCert;
  tls = await certDir(pki);
  datasource = await startDatasourceServer({ listen: { host: '127.0.0.1', port: 0 }, directory, keyring, logger });
  webhook = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: tls,
    logger,
    // The serial points at this test's datasource.
    mutate: { serials: serialMinter(keyring, datasource.baseUrl, 'nocloud'), newNonce },
  });
});

after(async () => {
  await webhook?.close();
  await datasource?.close();
  if (tls) await rm(tls, { recursive: true, force: true });
});

// Admits `object` in `namespace` and stores it as the API server would
// (with a fresh UID), seeded with `seedName`'s seed. Returns the VMI.
async function admit(review: Json, object: Json, seedName: string): Promise<VmiObject> {
  const r = structuredClone(review);
  r.request.uid = randomUUID();
  r.request.object = object;
  const patch = patchOf(await post(webhook.address.port, ca, JSON.stringify(r))) ?? [];
  const vmi = (await applyPatch(object, patch)) as VmiObject;
  vmi.metadata.uid = randomUUID();
  vmi.metadata.namespace = r.request.namespace as string;
  directory.put(`${vmi.metadata.namespace}/${vmi.metadata.name}`, vmi, nocloudSeed(seedName));
  return vmi;
}

function seedUrlOf(vmi: VmiObject): string {
  const serial = vmi.spec.domain!.firmware!.serial!;
  const m = /^ds=nocloud;s=(http:\/\/[^;]+\/)$/.exec(serial);
  assert.ok(m, serial);
  return m[1];
}

async function userData(seedUrl: string): Promise<string | undefined> {
  const res = await fetch(`${seedUrl}user-data`);
  const text = await res.text();
  return res.status === 200 ? text : undefined;
}

test("a VM's serial survives its restarts and is refused to the VM re-created later under the same name", async () => {
  const review = await fixtureReview('vmi-from-vm');
  const template: Json = review.request.object;
  const first = await admit(review, structuredClone(template), 'boot-1');
  const url = seedUrlOf(first);
  assert.match((await userData(url))!, /secret-of-boot-1/);

  // Restart: KubeVirt deletes the VMI and creates a new one from the VM.
  directory.drop('default/vm-cirros');
  assert.equal(await userData(url), undefined, 'no VMI, no seed');
  const second = await admit(review, structuredClone(template), 'boot-2');
  assert.notEqual(second.metadata.uid, first.metadata.uid);
  assert.equal(seedUrlOf(second), url, 'the same serial');
  assert.match((await userData(url))!, /secret-of-boot-2/, 'and it opens the new VMI');

  // The VM is deleted; someone else creates a VM of the same name.
  directory.drop('default/vm-cirros');
  const other = structuredClone(template);
  other.metadata.ownerReferences[0].uid = randomUUID();
  const third = await admit(review, other, 'someone-else');
  assert.notEqual(seedUrlOf(third), url);
  assert.equal(await userData(url), undefined, "the old token opens nothing of the new owner's VM");
  assert.match((await userData(seedUrlOf(third)))!, /secret-of-someone-else/);
  directory.drop('default/vm-cirros');
});

test("a VMI without a VM: its nonce's serial opens its seed only, and a copy of its manifest gets a new one", async () => {
  const review = await fixtureReview('vmi-direct');
  const first = await admit(review, structuredClone(review.request.object), 'direct-1');
  const url = seedUrlOf(first);
  assert.match((await userData(url))!, /secret-of-direct-1/);

  // Deleted, then created again by someone else from the exported manifest
  // (the nonce annotation and the serial included).
  directory.drop('tenant-a/vmi-nocloud');
  const copy = structuredClone(first) as Json;
  delete copy.metadata.uid;
  const second = await admit(review, copy, 'direct-2');
  assert.notEqual(second.metadata.annotations![NONCE_ANNOTATION], first.metadata.annotations![NONCE_ANNOTATION]);
  assert.notEqual(seedUrlOf(second), url);
  assert.equal(await userData(url), undefined);
  assert.match((await userData(seedUrlOf(second)))!, /secret-of-direct-2/);
  directory.drop('tenant-a/vmi-nocloud');
});

test('a nonce copied onto another VMI past the webhook: neither is served by it, so no VMI gets the other seed', async () => {
  const review = await fixtureReview('vmi-direct');
  const victim = await admit(review, structuredClone(review.request.object), 'victim');
  const url = seedUrlOf(victim);
  assert.match((await userData(url))!, /secret-of-victim/);
  // Another VMI of the namespace claims the victim's nonce (an annotation
  // edit after admission).
  const thief = structuredClone(victim);
  thief.metadata.name = 'thief';
  thief.metadata.uid = randomUUID();
  directory.put('tenant-a/thief', thief, nocloudSeed('thief'));
  assert.equal(await userData(url), undefined);
  directory.drop('tenant-a/thief');
  assert.match((await userData(url))!, /secret-of-victim/);
  directory.drop('tenant-a/vmi-nocloud');
});

test("the UID-bound token (vmseed seed-url's) still opens its VMI", async () => {
  const review = await fixtureReview('vmi-direct');
  const vmi = await admit(review, structuredClone(review.request.object), 'by-uid');
  const res = await fetch(`${datasource.baseUrl}/${keyring.sign(vmi.metadata.uid!)}/user-data`);
  assert.equal(res.status, 200);
  assert.match(await res.text(), /secret-of-by-uid/);
  directory.drop('tenant-a/vmi-nocloud');
});
