// The admission webhook over real HTTPS with AdmissionReview v1 requests
// (Kubernetes' documentation's and KubeVirt-shaped ones, test/fixtures/webhook):
// the patch, applied with Kubernetes' own JSON Patch, gives the expected VMI;
// VMIs outside the opt-in are never patched; hostile or malformed reviews get
// a clean answer and the server keeps serving.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { rm } from 'node:fs/promises';
import { connect } from 'node:tls';
import pino from 'pino';
import { serialMinter } from '../../../src/commands/cluster/webhook.ts';
import { startWebhookServer, type WebhookServer } from '../../../src/cluster/webhook/webhook-server.ts';
import { RESUME_ANNOTATION } from '../../../src/cluster/webhook/mutate.ts';
import { RESUME_ANNOTATION as SEED_GATE_RESUME_ANNOTATION } from '../../../src/agent/domain/seed-gate.ts';
import { applyPatch, certDir, fixtureReview, patchOf, post, testPki, type Json } from '../../support/webhook.ts';

const BASE = 'http://169.254.169.254/v1';
let server: WebhookServer;
let ca: string;
let dir: string;

before(async () => {
  const pki = await testPki('webhook');
  ca = pki.caCert;
  dir = await certDir(pki);
  server = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: dir,
    logger: pino({ level: 'silent' }),
    mutate: { serials: serialMinter(BASE, 'nocloud-net') },
  });
});

after(async () => {
  await server?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

async function review(body: Json): Promise<{ answer: Awaited<ReturnType<typeof post>>; patch: Json[] | undefined }> {
  const answer = await post(server.address.port, ca, JSON.stringify(body));
  return { answer, patch: patchOf(answer) };
}

function withObject(r: Json, edit: (o: Json) => void): Json {
  const copy = structuredClone(r);
  edit(copy.request.object);
  return copy;
}

test('the resume annotation written is the one the seed gate reads', () => {
  assert.equal(RESUME_ANNOTATION, SEED_GATE_RESUME_ANNOTATION);
});

// The token of a serial the webhook wrote: random, 43 base64url characters.
function tokenOf(serial: string): string {
  const m = /^ds=nocloud-net;s=http:\/\/169\.254\.169\.254\/v1\/([A-Za-z0-9_-]{43})\/$/.exec(serial);
  assert.ok(m, serial);
  return m[1];
}

test('a VM-made VMI: paused, resumed after its seed, and a serial with a fresh token; nothing else changes', async () => {
  const r = await fixtureReview('vmi-from-vm');
  const { answer, patch } = await review(r);
  assert.equal(answer.status, 200);
  assert.equal(answer.json!.apiVersion, 'admission.k8s.io/v1');
  assert.equal(answer.json!.kind, 'AdmissionReview');
  assert.equal(answer.json!.response.uid, r.request.uid);
  assert.equal(answer.json!.response.allowed, true);
  assert.equal(answer.json!.response.patchType, 'JSONPatch');
  const after = await applyPatch(r.request.object, patch!);
  const token = tokenOf(after.spec.domain.firmware.serial);
  const want = structuredClone(r.request.object);
  want.spec.startStrategy = 'Paused';
  want.metadata.annotations['vmseed.io/resume-after-seed'] = 'true';
  want.spec.domain.firmware.serial = `ds=nocloud-net;s=${BASE}/${token}/`;
  assert.deepEqual(after, want);
  // The same VM's next VMI (a restart): another token, nothing derived from the VM.
  const next = await applyPatch(r.request.object, (await review(r)).patch!);
  assert.notEqual(tokenOf(next.spec.domain.firmware.serial), token);
});

test('a VMI created directly: a serial with a fresh token, no annotation of ours but the gate; firmware is added when missing', async () => {
  const r = await fixtureReview('vmi-direct');
  const { patch } = await review(r);
  const after = await applyPatch(r.request.object, patch!);
  const token = tokenOf(after.spec.domain.firmware.serial);
  const want = structuredClone(r.request.object);
  want.spec.startStrategy = 'Paused';
  want.metadata.annotations['vmseed.io/resume-after-seed'] = 'true';
  want.spec.domain.firmware = { serial: `ds=nocloud-net;s=${BASE}/${token}/` };
  assert.deepEqual(after, want);
});

test('a copied manifest: our serial is replaced (in either ds= form), so the old token is not carried over', async () => {
  const r = await fixtureReview('vmi-direct');
  const first = await applyPatch(r.request.object, (await review(r)).patch!);
  const again = withObject(r, (o) => {
    o.metadata.annotations = { ...first.metadata.annotations };
    o.spec.domain.firmware = { ...first.spec.domain.firmware };
  });
  const second = await applyPatch(again.request.object, (await review(again)).patch!);
  assert.notEqual(second.spec.domain.firmware.serial, first.spec.domain.firmware.serial);
  assert.equal(second.metadata.annotations['vmseed.io/resume-after-seed'], 'true');
  const nocloud = withObject(r, (o) => {
    o.spec.domain.firmware = { serial: first.spec.domain.firmware.serial.replace('ds=nocloud-net;', 'ds=nocloud;') };
  });
  const third = await applyPatch(nocloud.request.object, (await review(nocloud)).patch!);
  assert.notEqual(tokenOf(third.spec.domain.firmware.serial), tokenOf(first.spec.domain.firmware.serial));
});

test("the owner's own choices stand: a start strategy, a serial, the gate's opt-out, a resume annotation", async () => {
  const r = await fixtureReview('vmi-from-vm');
  const own = withObject(r, (o) => {
    o.spec.startStrategy = 'Paused';
    o.spec.domain.firmware.serial = 'my-own-serial';
  });
  assert.equal((await review(own)).patch, undefined);
  const optOut = withObject(r, (o) => (o.metadata.annotations['vmseed.io/gate'] = 'false'));
  const ops = (await review(optOut)).patch!;
  assert.deepEqual(
    ops.map((o) => o.path),
    ['/spec/domain/firmware/serial'],
  );
  const noResume = withObject(r, (o) => (o.metadata.annotations['vmseed.io/resume-after-seed'] = 'false'));
  assert.deepEqual(
    (await review(noResume)).patch!.map((o) => o.path),
    ['/spec/domain/firmware/serial'],
    'a VMI nobody would unpause is not paused',
  );
});

test("KubeVirt IMDS's opt-in is in scope (the gate, which the agent opens once it serves the seed, and the serial); a VMI without an opt-in, an update, another resource are never patched", async () => {
  const r = await fixtureReview('vmi-direct');
  const imds = withObject(r, (o) => (o.metadata.annotations = { 'imds.kubevirt.io/enabled': 'true' }));
  assert.deepEqual(
    (await review(imds)).patch?.map((o) => o.path),
    ['/metadata/annotations/vmseed.io~1resume-after-seed', '/spec/startStrategy', '/spec/domain/firmware'],
  );
  const optedOut = withObject(
    r,
    (o) => (o.metadata.annotations = { 'imds.kubevirt.io/enabled': 'true', 'vmseed.io/gate': 'false' }),
  );
  assert.deepEqual(
    (await review(optedOut)).patch?.map((o) => o.path),
    ['/spec/domain/firmware'],
  );
  const cases: Json[] = [
    withObject(r, (o) => delete o.metadata.annotations),
    withObject(r, (o) => (o.metadata.annotations = { 'imds.kubevirt.io/enabled': 'false', other: 'x' })),
    withObject(r, (o) => (o.metadata.annotations = { 'vmseed.io/cloud-init-typo': 'x' })),
    { ...r, request: { ...r.request, operation: 'UPDATE', oldObject: r.request.object } },
    { ...r, request: { ...r.request, subResource: 'status' } },
    await fixtureReview('scale-update'),
  ];
  for (const c of cases) {
    const { answer, patch } = await review(c);
    assert.equal(answer.status, 200);
    assert.equal(answer.json!.response.uid, c.request.uid);
    assert.equal(answer.json!.response.allowed, true);
    assert.equal(patch, undefined, JSON.stringify(c.request.object?.metadata ?? c.request.kind));
    assert.equal(answer.json!.response.patchType, undefined);
  }
});

test('hostile and malformed reviews: a plain refusal or an allow without patch, and the server keeps serving', async () => {
  const port = server.address.port;
  const r = await fixtureReview('vmi-direct');
  const refusals: Array<[string | Buffer, number, RegExp, { contentType?: string; method?: string; path?: string }?]> =
    [
      ['not json', 400, /not JSON/],
      ['[1,2]', 400, /not a JSON object/],
      [
        JSON.stringify({ ...r, apiVersion: 'admission.k8s.io/v1beta1' }),
        400,
        /AdmissionReview of admission.k8s.io\/v1/,
      ],
      [JSON.stringify({ ...r, kind: 'Pod' }), 400, /AdmissionReview of/],
      [JSON.stringify({ apiVersion: r.apiVersion, kind: r.kind }), 400, /no request/],
      [JSON.stringify({ ...r, request: { ...r.request, uid: 7 } }), 400, /no valid uid/],
      [JSON.stringify({ ...r, request: { ...r.request, uid: 'u'.repeat(500) } }), 400, /no valid uid/],
      // Nesting a recursive reader would overflow on; inside the budget.
      ['['.repeat(500_000) + ']'.repeat(500_000), 400, /not a JSON object/],
      [Buffer.alloc(3 * 1024 * 1024, 0x20), 413, /larger than/],
      [JSON.stringify(r), 415, /application\/json/, { contentType: 'text/plain' }],
      [JSON.stringify(r), 405, /POST/, { method: 'PUT' }],
      [JSON.stringify(r), 404, /not found/, { path: '/other' }],
    ];
  for (const [body, status, message, options] of refusals) {
    const a = await post(port, ca, body, options ?? {});
    assert.equal(a.status, status, `${String(body).slice(0, 40)} -> ${a.body}`);
    assert.match(a.body, message);
  }
  const missingObject = { ...r, request: { ...r.request, object: undefined } };
  const a = await post(port, ca, JSON.stringify(missingObject));
  assert.equal(a.status, 200);
  assert.deepEqual(a.json!.response, { uid: r.request.uid, allowed: true });
  const wrongObjectKind = withObject(r, (o) => (o.kind = 'Pod'));
  assert.equal(patchOf(await post(port, ca, JSON.stringify(wrongObjectKind))), undefined);
  // Garbage where the VMI's parts should be: no patch, no crash.
  for (const edit of [
    (o: Json) => (o.metadata = 'x'),
    (o: Json) => (o.spec = []),
    (o: Json) => (o.metadata.annotations = ['vmseed.io/cloud-init']),
    (o: Json) => (o.metadata.ownerReferences = 'x'),
    (o: Json) => (o.spec.domain = null),
  ]) {
    const x = await post(port, ca, JSON.stringify(withObject(r, edit)));
    assert.equal(x.status, 200);
    assert.equal(x.json!.response.allowed, true);
  }
  // Still serving the real thing.
  assert.ok(patchOf(await post(port, ca, JSON.stringify(r)))!.length > 0);
});

test('a client that sends a body slowly and stops is cut by the request timeout, not held', async (t) => {
  const slow = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: dir,
    logger: pino({ level: 'silent' }),
    mutate: {},
    limits: { requestTimeoutMs: 1000, headersTimeoutMs: 500 },
  });
  t.after(() => slow.close());
  const closed = await new Promise<boolean>((resolve) => {
    const socket = connect({ host: '127.0.0.1', port: slow.address.port, ca }, () => {
      socket.write(
        'POST /mutate-virtualmachineinstance HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{',
      );
    });
    socket.on('error', () => undefined);
    socket.on('close', () => resolve(true));
    socket.resume();
  });
  assert.equal(closed, true);
});

test('many JSON bombs at once, each just under the budget: all refused, the server keeps serving', async () => {
  const bomb = Buffer.from(`[${'[],'.repeat(650_000)}[]]`);
  assert.ok(bomb.length < 2 * 1024 * 1024);
  const answers = await Promise.all(Array.from({ length: 16 }, () => post(server.address.port, ca, bomb)));
  for (const a of answers) assert.equal(a.status, 400);
  const r = await fixtureReview('vmi-direct');
  assert.equal((await post(server.address.port, ca, JSON.stringify(r))).status, 200);
});

test('a chunked body (no Content-Length) over the budget is refused as it arrives, with a 413', async () => {
  const { request } = await import('node:https');
  const status = await new Promise<number>((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port: server.address.port,
        path: '/mutate-virtualmachineinstance',
        method: 'POST',
        ca,
        agent: false,
        headers: { 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' },
      },
      (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      },
    );
    req.on('error', reject);
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    // Up to 4 MiB, stopping once an answer came.
    let sent = 0;
    const more = () => {
      while (sent < 64 && !req.destroyed) {
        sent++;
        if (!req.write(chunk)) return void req.once('drain', more);
      }
      req.end();
    };
    more();
  });
  assert.equal(status, 413);
  assert.equal((await post(server.address.port, ca, JSON.stringify(await fixtureReview('vmi-direct')))).status, 200);
});
