// KubeVirt IMDS's annotations rendered as IMDS serves them (rophy/kubevirt-imds
// internal/imds/handlers.go): meta-data instance-id `<ns>-<name>` and
// local-hostname `<name>` only, user-data from the annotation or a
// ConfigMap, no network-config, vendor-data from the operator's default.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderSeed, DEFAULT_RENDER_OPTIONS } from '../../src/cloudinit/render.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { VmseedError } from '../../src/errors.ts';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';

const text = (u: Uint8Array | undefined) => (u === undefined ? undefined : Buffer.from(u).toString('utf8'));

function imdsVmi(annotations: Record<string, string>, extra: Partial<VmiObject['spec']> = {}): VmiObject {
  return {
    metadata: { name: 'web-1', namespace: 'team-a', uid: 'u1', annotations },
    spec: {
      hostname: 'not-used-by-imds',
      domain: { firmware: { serial: 'ds=nocloud;s=http://169.254.169.254/v1/' } },
      ...extra,
    },
  };
}

const UD = '#cloud-config\npackages: [jq]\n';

test('enabled + user-data: IMDS meta-data keys and instance-id, the annotation verbatim, HTTP only, no network-config', async () => {
  const out = await renderSeed(
    imdsVmi({ 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data': UD }),
    new MemoryResolver(),
    DEFAULT_RENDER_OPTIONS,
  );
  assert.equal(out.kind, 'seed');
  if (out.kind !== 'seed') return;
  assert.deepEqual(out.seed.metaData, { 'instance-id': 'team-a-web-1', 'local-hostname': 'web-1' });
  assert.equal(text(out.seed.userData), UD);
  assert.equal(out.seed.networkConfig, undefined, 'network-config 404 → DHCP, as IMDS');
  assert.equal(out.seed.vendorData, undefined);
  assert.equal(out.seed.delivery, 'http');
  assert.equal(out.seed.datasource, 'nocloud');
  assert.deepEqual(out.seed.warnings, []);
  assert.deepEqual(
    serializeMetaData(out.seed).map((f) => f.path),
    ['meta-data', 'user-data'],
  );
});

test('only the exact value "true" opts in (IMDS compares the string)', async () => {
  for (const v of ['True', 'yes', '1', '']) {
    const out = await renderSeed(
      imdsVmi({ 'imds.kubevirt.io/enabled': v, 'imds.kubevirt.io/user-data': UD }),
      new MemoryResolver(),
      DEFAULT_RENDER_OPTIONS,
    );
    assert.equal(out.kind, 'skip', v);
  }
});

test('enabled without user-data: empty user-data (cloud-init would fail the datasource on a 404)', async () => {
  const out = await renderSeed(
    imdsVmi({ 'imds.kubevirt.io/enabled': 'true' }),
    new MemoryResolver(),
    DEFAULT_RENDER_OPTIONS,
  );
  assert.equal(out.kind, 'seed');
  if (out.kind === 'seed') assert.equal(out.seed.userData.length, 0);
});

test('user-data from a ConfigMap: default key user-data, or name/key', async () => {
  const refs = new MemoryResolver({
    configMaps: [
      { metadata: { namespace: 'team-a', name: 'ud' }, data: { 'user-data': UD, other: '#!/bin/sh\necho other\n' } },
    ],
  });
  const a = await renderSeed(
    imdsVmi({ 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data-configmap': 'ud' }),
    refs,
    DEFAULT_RENDER_OPTIONS,
  );
  assert.equal(a.kind === 'seed' && text(a.seed.userData), UD);
  const b = await renderSeed(
    imdsVmi({ 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data-configmap': 'ud/other' }),
    refs,
    DEFAULT_RENDER_OPTIONS,
  );
  assert.equal(b.kind === 'seed' && text(b.seed.userData), '#!/bin/sh\necho other\n');
  // Missing ConfigMap: retryable (it is often applied after the VM).
  await assert.rejects(
    renderSeed(
      imdsVmi({ 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data-configmap': 'absent' }),
      refs,
      DEFAULT_RENDER_OPTIONS,
    ),
    (e: unknown) => e instanceof VmseedError && e.code === 'CONFIGMAP_NOT_FOUND' && e.kind === 'retryable',
  );
  await assert.rejects(
    renderSeed(
      imdsVmi({ 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data-configmap': 'Bad Name' }),
      refs,
      DEFAULT_RENDER_OPTIONS,
    ),
    (e: unknown) =>
      e instanceof VmseedError &&
      e.code === 'ANNOTATION_INVALID' &&
      e.field === 'metadata.annotations.imds.kubevirt.io/user-data-configmap',
  );
  await assert.rejects(
    renderSeed(
      imdsVmi({
        'imds.kubevirt.io/enabled': 'true',
        'imds.kubevirt.io/user-data': UD,
        'imds.kubevirt.io/user-data-configmap': 'ud',
      }),
      refs,
      DEFAULT_RENDER_OPTIONS,
    ),
    (e: unknown) => e instanceof VmseedError && e.code === 'USERDATA_SOURCE_CONFLICT',
  );
});

test('vendor-data: the operator default (--vendor-data-from) is served to IMDS VMIs', async () => {
  const refs = new MemoryResolver({
    configMaps: [
      {
        metadata: { namespace: 'vmseed-system', name: 'vd' },
        data: { 'vendor-data': '#cloud-config\nntp: {enabled: true}\n' },
      },
    ],
  });
  const out = await renderSeed(imdsVmi({ 'imds.kubevirt.io/enabled': 'true' }), refs, {
    ...DEFAULT_RENDER_OPTIONS,
    defaultVendorData: { namespace: 'vmseed-system', name: 'vd' },
  });
  assert.equal(out.kind === 'seed' && text(out.seed.vendorData), '#cloud-config\nntp: {enabled: true}\n');
});

test('user-data over the size budget is refused before it is served', async () => {
  await assert.rejects(
    renderSeed(
      imdsVmi({ 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data': UD + '#'.repeat(100) }),
      new MemoryResolver(),
      { ...DEFAULT_RENDER_OPTIONS, maxUserDataBytes: 64 },
    ),
    (e: unknown) => e instanceof VmseedError && e.code === 'USERDATA_TOO_LARGE',
  );
});

test("the vmseed annotation wins over IMDS's; a KubeVirt volume is kept when vmseed builds volumes, coexists when KubeVirt does", async () => {
  const both = imdsVmi({
    'imds.kubevirt.io/enabled': 'true',
    'imds.kubevirt.io/user-data': UD,
    'vmseed.io/cloud-init': 'userData: "#cloud-config\\n"',
  });
  const a = await renderSeed(both, new MemoryResolver(), DEFAULT_RENDER_OPTIONS);
  assert.equal(a.kind === 'seed' && a.seed.delivery, undefined);
  const vol = imdsVmi(
    { 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data': UD },
    {
      volumes: [{ name: 'ci', cloudInitNoCloud: { userData: '#cloud-config\nhostname: vol\n' } }],
    },
  );
  const own = await renderSeed(vol, new MemoryResolver(), DEFAULT_RENDER_OPTIONS);
  assert.equal(own.kind === 'seed' && text(own.seed.userData), '#cloud-config\nhostname: vol\n');
  const ignore = await renderSeed(vol, new MemoryResolver(), { ...DEFAULT_RENDER_OPTIONS, kubevirtVolumes: 'ignore' });
  assert.equal(ignore.kind === 'seed' && ignore.seed.delivery, 'http');
});
