// renderSeed behaviour the corpus does not show well: defaults, determinism,
// retry semantics around references, and that no message or warning ever
// quotes user data.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { VmseedError } from '../../src/errors.ts';
import type { RefResolver, SecretObject, VmiObject } from '../../src/api/objects.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { ANNOTATION } from '../../src/cloudinit/annotation/annotation.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import { decodeBase64Strict } from '../../src/cloudinit/base64.ts';

const annotated = (text: string, spec: Partial<VmiObject['spec']> = {}): VmiObject => ({
  metadata: { name: 'vm', namespace: 'ns', annotations: { [ANNOTATION]: text } },
  spec: { ...spec },
});

test('defaults are generous and own KubeVirt volumes', () => {
  assert.equal(DEFAULT_RENDER_OPTIONS.kubevirtVolumes, 'own');
  assert.equal(DEFAULT_RENDER_OPTIONS.maxUserDataBytes, 1024 * 1024);
  assert.equal(DEFAULT_RENDER_OPTIONS.maxNetworkDataBytes, 64 * 1024);
});

test('the size limit applies to Secret content too, not only inline data', async () => {
  const big = '#cloud-config\n' + 'a: 1\n'.repeat(1000);
  const refs = new MemoryResolver({
    secrets: [{ metadata: { name: 's', namespace: 'ns' }, stringData: { userdata: big } }],
  });
  const opts = { ...DEFAULT_RENDER_OPTIONS, maxUserDataBytes: 4096 };
  await assert.rejects(renderSeed(annotated('secretRef: {name: s}'), refs, opts), {
    code: 'USERDATA_TOO_LARGE',
    kind: 'terminal',
  });
  const ok = await renderSeed(annotated('secretRef: {name: s}'), refs, DEFAULT_RENDER_OPTIONS);
  assert.equal(ok.kind, 'seed');
});

test('a Secret that appears later turns a retryable error into a seed', async () => {
  const refs = new MemoryResolver();
  const vmi = annotated('secretRef: {name: late}');
  await assert.rejects(renderSeed(vmi, refs, DEFAULT_RENDER_OPTIONS), (e: unknown) => {
    assert.ok(e instanceof VmseedError && e.code === 'SECRET_NOT_FOUND' && e.retryable);
    return true;
  });
  refs.putSecret({
    metadata: { name: 'late', namespace: 'ns' },
    data: { userdata: Buffer.from('#!/bin/sh\n').toString('base64') },
  });
  const out = await renderSeed(vmi, refs, DEFAULT_RENDER_OPTIONS);
  assert.equal(out.kind, 'seed');
});

test('transport errors from the resolver propagate unchanged (the caller retries)', async () => {
  const failing: RefResolver = {
    getSecret: async () => {
      throw new VmseedError('KUBE_API_UNAVAILABLE', 'api down', { kind: 'retryable' });
    },
    getConfigMap: async () => undefined,
  };
  await assert.rejects(renderSeed(annotated('secretRef: {name: s}'), failing, DEFAULT_RENDER_OPTIONS), {
    code: 'KUBE_API_UNAVAILABLE',
  });
});

test('rendering is deterministic: same input, same bytes (no clock, no randomness)', async () => {
  const vmi = annotated('userData: "#cloud-config\\n{}\\n"\ndatasource: configdrive');
  const a = await renderSeed(vmi, new MemoryResolver(), DEFAULT_RENDER_OPTIONS);
  const b = await renderSeed(structuredClone(vmi), new MemoryResolver(), DEFAULT_RENDER_OPTIONS);
  assert.ok(a.kind === 'seed' && b.kind === 'seed');
  assert.deepEqual(serializeMetaData(a.seed), serializeMetaData(b.seed));
});

test('renderSeed does not modify the VMI or the Secrets it reads', async () => {
  const vmi: VmiObject = {
    metadata: { name: 'vm', namespace: 'ns' },
    spec: {
      volumes: [{ name: 'c', cloudInitNoCloud: { userData: '#!/bin/sh\n', networkDataSecretRef: { name: 's' } } }],
    },
  };
  const secret: SecretObject = {
    metadata: { name: 's', namespace: 'ns' },
    data: { networkdata: Buffer.from('version: 2\nethernets: {}\n').toString('base64') },
  };
  const before = structuredClone({ vmi, secret });
  await renderSeed(vmi, new MemoryResolver({ secrets: [secret] }), DEFAULT_RENDER_OPTIONS);
  assert.deepEqual({ vmi, secret }, before);
});

test('no error message or warning ever contains the user-data, network data or Secret content', async () => {
  const marker = 'S3CR3T-MARKER';
  const payloads = fc.oneof(
    fc.constant(`#cloud-config\npassword: ${marker}\n  bad: [indent\n`),
    fc.constant(`#cloud-config\n- ${marker}\n`),
    fc.constant(`${marker}: plain yaml without header\n`),
    fc.string().map((s) => `#cloud-config\n${marker}: ${s}\n\t- x`),
    fc.string().map((s) => `${s}${marker}`),
    fc
      .constantFrom('!', '!<', '*', '&', '!!', '%TAG ! ')
      .map((p) => `#cloud-config\na: ${p}${marker}\nb: *${marker}\n`),
    fc.constantFrom('!', '!<', '*', '&').map((p) => `version: 2\nethernets: ${p}${marker}\n`),
  );
  const places = fc.constantFrom('annotation', 'secret', 'network', 'base64', 'cdnetwork');
  await fc.assert(
    fc.asyncProperty(payloads, places, async (payload, place) => {
      const secret: SecretObject = {
        metadata: { name: 's', namespace: 'ns' },
        stringData: { userdata: payload, networkdata: payload },
      };
      const refs = new MemoryResolver({ secrets: [secret] });
      const text = {
        annotation: `userData: ${JSON.stringify(payload)}`,
        secret: 'secretRef: {name: s}',
        network: `networkDataSecretRef: {name: s}`,
        base64: `userDataBase64: ${JSON.stringify(payload)}`,
        cdnetwork: `datasource: configdrive\nnetworkData: ${JSON.stringify(payload)}`,
      }[place];
      try {
        const out = await renderSeed(annotated(text), refs, { ...DEFAULT_RENDER_OPTIONS, maxUserDataBytes: 1 << 20 });
        if (out.kind === 'seed') for (const w of out.seed.warnings) assert.ok(!w.message.includes(marker), w.message);
      } catch (e) {
        assert.ok(e instanceof VmseedError, String(e));
        assert.ok(!e.message.includes(marker), e.message);
        assert.ok(!JSON.stringify(e.toJSON()).includes(marker));
      }
    }),
    { numRuns: 300 },
  );
});

test('strict base64 follows Go StdEncoding: padding required, CR/LF ignored, junk rejected', () => {
  const ok = (s: string) => decodeBase64Strict(s).ok;
  assert.equal(ok('aGVsbG8='), true);
  assert.equal(ok('aGVs\nbG8=\r\n'), true);
  assert.equal(ok(''), true);
  assert.equal(ok('aGVsbG8'), false);
  assert.equal(ok('aGVs bG8='), false);
  assert.equal(ok('aGVsbG8=='), false);
  assert.equal(ok('aG=sbG8='), false);
  assert.equal(ok('aGVsbG8_'), false);
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 200 }), (bytes) => {
      const r = decodeBase64Strict(Buffer.from(bytes).toString('base64'));
      assert.ok(r.ok);
      assert.deepEqual(Buffer.from(r.bytes), Buffer.from(bytes));
    }),
  );
});

test('ignore mode still renders annotation-only VMIs, and reports the conflict as a skip warning', async () => {
  const opts = { ...DEFAULT_RENDER_OPTIONS, kubevirtVolumes: 'ignore' as const };
  const only = await renderSeed(annotated('userData: "#!/bin/sh\\n"'), new MemoryResolver(), opts);
  assert.equal(only.kind, 'seed');
  const both = await renderSeed(
    annotated('userData: "#!/bin/sh\\n"', {
      volumes: [{ name: 'c', cloudInitConfigDrive: { userData: '#!/bin/sh\n' } }],
    }),
    new MemoryResolver(),
    opts,
  );
  assert.equal(both.kind, 'skip');
  assert.ok(
    both.kind === 'skip' &&
      both.warning?.code === 'KUBEVIRT_VOLUME_CONFLICT' &&
      both.warning.field === 'spec.volumes[0]',
  );
});

test('Secret data that is not base64 (only possible outside the API server) is a terminal SECRET_DATA_INVALID', async () => {
  const refs = new MemoryResolver({
    secrets: [{ metadata: { name: 's', namespace: 'ns' }, data: { userdata: 'plain #cloud-config text' } }],
  });
  await assert.rejects(renderSeed(annotated('secretRef: {name: s}'), refs, DEFAULT_RENDER_OPTIONS), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'SECRET_DATA_INVALID');
    assert.equal(e.kind, 'terminal');
    assert.equal(e.field, 'secret/s.data.userdata');
    assert.ok(!e.message.includes('plain #cloud-config'));
    return true;
  });
});

test('stringData wins over data for the same key, as on the API server', async () => {
  const refs = new MemoryResolver({
    secrets: [
      {
        metadata: { name: 's', namespace: 'ns' },
        data: { userdata: Buffer.from('#!/bin/sh\necho data\n').toString('base64') },
        stringData: { userdata: '#!/bin/sh\necho stringData\n' },
      },
    ],
  });
  const out = await renderSeed(annotated('secretRef: {name: s}'), refs, DEFAULT_RENDER_OPTIONS);
  assert.ok(out.kind === 'seed');
  assert.equal(Buffer.from(out.seed.userData).toString(), '#!/bin/sh\necho stringData\n');
});
