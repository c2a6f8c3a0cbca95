// Adoption of KubeVirt cloud-init volumes through the webhook over real
// HTTPS, with the shapes real tools write (test/fixtures/adoption: Cluster
// API's KubeVirt provider, Harvester, virtctl, KubeVirt's examples) and
// their Secrets on the fake API server, read with the cluster component's
// own service account under the RBAC `deploy/webhook` installs. The patch is
// applied with Kubernetes' JSON Patch; the adopted VMI's seed, rendered as
// the node agent renders it, has the very files of the VMI as submitted.
// Whatever cannot be adopted is answered without a patch, a warning, and a
// SeedWarning Event, never half-adopted.
// Two webhooks: one that authenticates the API server by its client
// certificate, and one that does not, where only a VMI's VirtualMachine
// vouches for a review; a review nobody vouches for reads no object and
// writes no Event, so its answer says nothing of another tenant's Secrets.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import pino from 'pino';
import type { SecretObject, VmiObject } from '../../../src/api/objects.ts';
import { serialMinter } from '../../../src/commands/cluster/webhook.ts';
import { KubeAdoptionEvents } from '../../../src/cluster/webhook/adoption-events.ts';
import { ADOPT_PATH, startWebhookServer, type WebhookServer } from '../../../src/cluster/webhook/webhook-server.ts';
import { ADOPTED_ANNOTATION, readAdopted } from '../../../src/cloudinit/kubevirt/adopted.ts';
import { MemoryResolver } from '../../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../../src/cloudinit/render.ts';
import { serializeMetaData } from '../../../src/cloudinit/seed-files.ts';
import { KubeConnectionApi } from '../../../src/kube/api-client.ts';
import { KubeRefResolver } from '../../../src/kube/resolver.ts';
import { FakeKube } from '../../support/fake-kube.ts';
import { kustomize } from '../../support/kustomize.ts';
import { applyPatch, certDir, clientPki, patchOf, post, testPki, type Json } from '../../support/webhook.ts';
import { resourceType } from '../../support/fake-kube-objects.ts';

const ROOT = new URL('../../../', import.meta.url).pathname;
const FIXTURES = join(ROOT, 'test', 'fixtures', 'adoption');
const BASE = 'http://169.254.169.254/v1';

interface Fixture {
  name: string;
  vmi: Json;
  secrets: SecretObject[];
}

const fixtures: Fixture[] = readdirSync(FIXTURES)
  .filter((f) => f.endsWith('.json'))
  .map((f) => {
    const doc = JSON.parse(readFileSync(join(FIXTURES, f), 'utf8')) as Json;
    return { name: f.replace(/\.json$/, ''), vmi: doc.vmi as Json, secrets: (doc.secrets ?? []) as SecretObject[] };
  });

// Left to KubeVirt, and why.
const NOT_ADOPTED: Record<string, RegExp> = {
  'kubevirt-example-vmi-nocloud': /disk "emptydisk" comes after the cloud-init disk/,
  'virtctl-accesscred-nocloud': /accessCredentials propagate SSH keys through the cloud-init volume/,
};

let fake: FakeKube;
let server: WebhookServer;
// No client certificates: VirtualMachines vouch.
let open: WebhookServer;
let events: KubeAdoptionEvents;
let ca: string;
let dir: string;
let identity: { cert: string; key: string };

before(async () => {
  const rbac = await kustomize(join(ROOT, 'deploy', 'webhook'));
  fake = await FakeKube.start({ rbac });
  for (const f of fixtures) for (const s of f.secrets) fake.setSecret(s);
  const api = new KubeConnectionApi(fake.connection(fake.serviceAccountToken('vmseed', 'vmseed-cluster')), {
    timeoutMs: 2000,
  });
  events = new KubeAdoptionEvents({ api, logger: pino({ level: 'silent' }), host: 'vmseed-cluster-0' });
  const pki = await testPki('webhook');
  ca = pki.caCert;
  dir = await certDir(pki);
  const client = await clientPki('webhook-client-ca', ['kube-apiserver']);
  identity = client.clients['kube-apiserver'];
  await writeFile(join(dir, 'client-ca.crt'), client.caCert);
  const options = {
    listen: { host: '127.0.0.1', port: 0 },
    certDir: dir,
    logger: pino({ level: 'silent' }),
    mutate: { serials: serialMinter(BASE, 'nocloud-net') },
    adoption: { secrets: new KubeRefResolver(api), events, timeoutMs: 2000 },
    vms: api,
  };
  server = await startWebhookServer({ ...options, clientAuth: { caFile: join(dir, 'client-ca.crt') } });
  open = await startWebhookServer(options);
});

after(async () => {
  await server?.close();
  await open?.close();
  await events?.flush();
  await fake?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

function reviewOf(vmi: Json, options: { dryRun?: boolean } = {}): string {
  return JSON.stringify({
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid: `r-${Math.random().toString(16).slice(2)}`,
      kind: { group: 'kubevirt.io', version: 'v1', kind: 'VirtualMachineInstance' },
      resource: { group: 'kubevirt.io', version: 'v1', resource: 'virtualmachineinstances' },
      namespace: vmi.metadata.namespace,
      operation: 'CREATE',
      object: vmi,
      ...(options.dryRun ? { dryRun: true } : {}),
    },
  });
}

function asking(vmi: Json, value = 'true'): Json {
  const copy = structuredClone(vmi);
  copy.metadata.annotations = { ...(copy.metadata.annotations ?? {}), 'vmseed.io/adopt': value };
  return copy;
}

async function admit(vmi: Json, options: { path?: string; dryRun?: boolean; on?: WebhookServer } = {}) {
  const on = options.on ?? server;
  const answer = await post(on.address.port, ca, reviewOf(vmi, options), {
    ...(options.path ? { path: options.path } : {}),
    ...(on === server ? { identity } : {}),
  });
  assert.equal(answer.status, 200, answer.body);
  assert.equal(answer.json!.response.allowed, true);
  return { patch: patchOf(answer), warnings: (answer.json!.response.warnings ?? []) as string[] };
}

// The seed's files as the image holds them.
async function filesOf(vmi: Json, secrets: SecretObject[], kubevirtVolumes: 'own' | 'ignore') {
  const outcome = await renderSeed(vmi as VmiObject, new MemoryResolver({ secrets }), {
    ...DEFAULT_RENDER_OPTIONS,
    kubevirtVolumes,
  });
  assert.equal(outcome.kind, 'seed', outcome.kind === 'skip' ? outcome.reason : '');
  const seed = outcome.seed;
  return {
    datasource: seed.datasource,
    files: serializeMetaData(seed).map((f) => [f.path, Buffer.from(f.bytes).toString('base64')]),
  };
}

function eventsAbout(name: string) {
  return fake.events().filter((e: Json) => e.involvedObject?.name === name);
}

for (const f of fixtures) {
  test(`real shape ${f.name}: ${NOT_ADOPTED[f.name] ? 'left to KubeVirt, with a warning and an Event' : 'adopted; the agent renders the same seed files KubeVirt would'}`, async () => {
    const submitted = asking(f.vmi);
    const { patch, warnings } = await admit(submitted);
    const why = NOT_ADOPTED[f.name];
    if (why) {
      assert.equal(patch, undefined, 'nothing half-adopted');
      assert.match(warnings[0], /^ADOPTION_SKIPPED \(/);
      assert.match(warnings[0], why);
      await events.flush();
      return;
    }
    assert.ok(patch, `not adopted: ${warnings.join(' | ')}`);
    assert.ok(!warnings.some((w) => w.startsWith('ADOPTION_SKIPPED')), warnings.join(' | '));
    const adopted = await applyPatch(submitted, patch);
    const volume = submitted.spec.volumes.find((v: Json) => v.cloudInitNoCloud || v.cloudInitConfigDrive);
    assert.ok(!adopted.spec.volumes.some((v: Json) => v.cloudInitNoCloud || v.cloudInitConfigDrive), 'volume moved');
    assert.ok(!adopted.spec.domain.devices.disks.some((d: Json) => d.name === volume.name), 'disk moved');
    assert.equal(adopted.spec.startStrategy, 'Paused');
    assert.equal(adopted.metadata.annotations['vmseed.io/resume-after-seed'], 'true');
    assert.match(adopted.spec.domain.firmware.serial, /^ds=nocloud-net;s=http:\/\/169\.254\.169\.254\/v1\//);
    const record = readAdopted(adopted.metadata.annotations[ADOPTED_ANNOTATION]);
    assert.deepEqual(record.volume, volume);
    assert.equal(record.by, 'annotation');
    // The node agent on a KubeVirt node leaves KubeVirt's volumes alone, and builds this one.
    assert.deepEqual(await filesOf(adopted, f.secrets, 'ignore'), await filesOf(submitted, f.secrets, 'own'));
    // Asked again (reinvocation): the adopted VMI stays adopted, nothing more is removed.
    const again = await admit(adopted);
    const ops = (again.patch ?? []).map((o) => `${o.op} ${o.path}`);
    assert.ok(!ops.some((o) => o.startsWith('remove') || o.includes('adopted')), ops.join(', '));
  });
}

// The VirtualMachine that made `vmi`, stored on the fake API server: its
// template is the VMI's spec and annotations; the VMI's ownerReference gets
// the UID the server gave it.
function storeVm(vmi: Json): Json {
  const vm = {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachine',
    metadata: { name: vmi.metadata.name, namespace: vmi.metadata.namespace },
    spec: {
      runStrategy: 'Always',
      template: { metadata: { annotations: vmi.metadata.annotations ?? {} }, spec: vmi.spec },
    },
  };
  fake.objects.create(
    resourceType('', 'namespaces')!,
    undefined,
    JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: vmi.metadata.namespace } }),
  );
  const reply = fake.objects.create(
    resourceType('kubevirt.io', 'virtualmachines')!,
    vmi.metadata.namespace,
    JSON.stringify(vm),
  );
  assert.equal(reply.code, 201);
  const uid = (reply.body as Json).metadata.uid as string;
  const made = structuredClone(vmi);
  made.metadata.ownerReferences = [
    { apiVersion: 'kubevirt.io/v1', kind: 'VirtualMachine', name: vm.metadata.name, uid, controller: true },
  ];
  return made;
}

test("no client certificate: the VMI's VirtualMachine vouches; adopted, and a missing Secret gets a warning and an Event on the VM, none on a dry run", async () => {
  const capk = fixtures.find((f) => f.name === 'capk-controlplane')!;
  const good = asking(capk.vmi);
  good.metadata.name = 'capk-vouched';
  const vouched = storeVm(good);
  const adopted = await admit(vouched, { on: open });
  assert.ok(
    adopted.patch?.some((o) => o.op === 'remove'),
    adopted.warnings.join(' | '),
  );

  const vmi = asking(capk.vmi);
  vmi.metadata.name = 'capk-missing';
  vmi.spec.volumes[1].cloudInitConfigDrive.secretRef.name = 'no-such-userdata';
  const made = storeVm(vmi);
  const uid = made.metadata.ownerReferences[0].uid;
  const dry = await admit(made, { dryRun: true, on: open });
  assert.equal(dry.patch, undefined);
  await events.flush();
  assert.equal(eventsAbout('capk-missing').length, 0, 'no side effect on a dry run');
  const { patch, warnings } = await admit(made, { on: open });
  assert.equal(patch, undefined);
  assert.match(warnings[0], /^ADOPTION_SKIPPED \(spec\.volumes\[1\]\.cloudInitConfigDrive\.secretRef\)/);
  assert.match(warnings[0], /SECRET_NOT_FOUND/);
  await events.flush();
  const [event] = eventsAbout('capk-missing');
  assert.ok(event, 'an Event');
  assert.equal(event.type, 'Warning');
  assert.equal(event.reason, 'SeedWarning');
  assert.deepEqual(
    [event.involvedObject.kind, event.involvedObject.uid, event.metadata.namespace],
    ['VirtualMachine', uid, 'capi-tenant'],
  );
  assert.match(
    event.message,
    /^ADOPTION_SKIPPED .*KubeVirt builds the cloud-init volume, not vmseed: SECRET_NOT_FOUND/,
  );
});

test('a forged review (no client certificate, no VirtualMachine vouching) reads no Secret and writes no Event: its answer is the same whether the Secret exists or not', async () => {
  const victim = fixtures.find((f) => f.name === 'capk-controlplane')!;
  const secretName = victim.secrets[0].metadata.name;
  const forged = (secret: string, owner?: Json): Json => {
    const v = asking(victim.vmi);
    v.metadata.name = 'forged';
    v.spec.volumes[1].cloudInitConfigDrive.secretRef.name = secret;
    if (owner) v.metadata.ownerReferences = [owner];
    return v;
  };
  const before = fake.requests.length;
  const answers = [];
  for (const owner of [
    undefined,
    // A VM of that name does not exist, or exists under another UID.
    { apiVersion: 'kubevirt.io/v1', kind: 'VirtualMachine', name: 'nope', uid: 'u-1', controller: true },
  ])
    for (const secret of [secretName, 'does-not-exist']) {
      const a = await admit(forged(secret, owner), { on: open });
      answers.push({ patch: a.patch, warnings: a.warnings.map((w) => w.replace(secret, 'S')) });
    }
  await events.flush();
  assert.equal(answers[0].patch, undefined);
  assert.match(answers[0].warnings[0], /REVIEW_UNVERIFIED: the review is not known to be the API server's/);
  assert.deepEqual(answers[1], answers[0]);
  assert.deepEqual(answers[3], answers[2]);
  const reads = fake.requests.slice(before).filter((r) => r.path.includes('/secrets/'));
  assert.deepEqual(reads, [], 'no Secret read');
  assert.equal(eventsAbout('forged').length, 0, 'no Event');
  assert.equal(eventsAbout('nope').length, 0, 'no Event');
});

test('too large, invalid base64, a Secret key that is not there: unchanged, each with its code, no content quoted', async () => {
  const ns = 'adopt-bad';
  const big = 'x'.repeat(DEFAULT_RENDER_OPTIONS.maxUserDataBytes + 1);
  fake.setSecret({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: 'big', namespace: ns },
    data: { userdata: Buffer.from(`#cloud-config\n# ${big}`).toString('base64') },
  });
  fake.setSecret({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: 'other-keys', namespace: ns },
    data: { password: Buffer.from('SECRET-VALUE-42').toString('base64') },
  });
  const vmiWith = (name: string, source: Json): Json => ({
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: { name, namespace: ns, annotations: { 'vmseed.io/adopt': 'true' } },
    spec: {
      domain: { devices: { disks: [{ name: 'cloudinit', disk: { bus: 'virtio' } }] } },
      volumes: [{ name: 'cloudinit', cloudInitNoCloud: source }],
    },
  });
  const cases: Array<[string, Json, RegExp]> = [
    ['too-large', { secretRef: { name: 'big' } }, /USERDATA_TOO_LARGE/],
    ['bad-base64', { userDataBase64: '!!not base64!!' }, /USERDATA_BASE64_INVALID/],
    ['no-key', { secretRef: { name: 'other-keys' } }, /SECRET_KEY_NOT_FOUND|CLOUDINIT_DATA_EMPTY/],
    ['inline-over-kubevirt-limit', { userData: `#cloud-config\n# ${'y'.repeat(2100)}` }, /KUBEVIRT_INLINE_LIMIT/],
  ];
  for (const [name, source, code] of cases) {
    const { patch, warnings } = await admit(vmiWith(name, source));
    assert.equal(patch, undefined, `${name}: nothing half-adopted`);
    assert.match(warnings[0] ?? '', code, name);
    assert.ok(Buffer.byteLength(warnings[0]) <= 256, `${name}: ${warnings[0]}`);
    assert.ok(!warnings.join('\n').includes('SECRET-VALUE-42'));
  }
  await events.flush();
  for (const [name, , code] of cases) {
    const [event] = eventsAbout(name);
    assert.ok(event, `${name}: an Event on the VMI by name`);
    assert.equal(event.involvedObject.kind, 'VirtualMachineInstance');
    assert.match(event.message, code);
    assert.ok(!event.message.includes('SECRET-VALUE-42'));
  }
});

test('namespace opt-in (the second webhook\'s path): adopted and recorded as such; vmseed.io/adopt "false" keeps a VMI out', async () => {
  const example = fixtures.find((f) => f.name === 'kubevirt-example-vmi-masquerade')!;
  const { patch } = await admit(example.vmi, { path: ADOPT_PATH });
  const adopted = await applyPatch(example.vmi, patch!);
  assert.equal(readAdopted(adopted.metadata.annotations[ADOPTED_ANNOTATION]).by, 'namespace');
  const out = await admit(asking(example.vmi, 'false'), { path: ADOPT_PATH });
  assert.equal(out.patch, undefined);
  assert.deepEqual(out.warnings, []);
  // The first path adopts only on the VMI's own ask.
  const plain = await admit(example.vmi);
  assert.equal(plain.patch, undefined);
  assert.deepEqual(plain.warnings, []);
});

test('asked, but with the vmseed annotation too or with no cloud-init volume: unchanged, and why', async () => {
  const example = fixtures.find((f) => f.name === 'kubevirt-example-vmi-masquerade')!;
  const both = asking(example.vmi);
  both.metadata.annotations['vmseed.io/cloud-init'] = 'userData: "#cloud-config"';
  const a = await admit(both);
  assert.ok(!(a.patch ?? []).some((o) => o.op === 'remove'), 'the volume stays');
  assert.match(a.warnings[0], /ADOPTION_SKIPPED .*vmseed\.io\/cloud-init annotation too/);
  const none = asking(example.vmi);
  none.spec.volumes = none.spec.volumes.filter((v: Json) => !v.cloudInitNoCloud);
  none.spec.domain.devices.disks = none.spec.domain.devices.disks.filter((d: Json) => d.name !== 'cloudinitdisk');
  const b = await admit(none);
  assert.equal(b.patch, undefined);
  assert.match(b.warnings[0], /no cloudInitNoCloud or cloudInitConfigDrive volume/);
});
