// A seed's cloud-config checked against cloud-init's schemas on the node:
// warnings that name the document, path, release and module (never a
// value), the per-VMI release annotation, a check that cannot run never
// failing the seed, and what the agent shows of it (status page line,
// vmseed_cloud_init_schema_info, vmseed_seed_schema_problems).
import '../support/schema-files.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { VmiObject } from '../../src/api/objects.ts';
import { ANNOTATION } from '../../src/cloudinit/annotation/annotation.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed, type RenderOptions } from '../../src/cloudinit/render.ts';
import { INLINE_OFFLOAD, type Offload } from '../../src/cloudinit/pure-ops.ts';
import { CLOUD_INIT_VERSION_ANNOTATION } from '../../src/cloudinit/schema/release-annotation.ts';
import { DEFAULT_SCHEMA_DIR } from '../../src/cloudinit/schema/schema-store.ts';
import type { Seed, SeedWarning } from '../../src/cloudinit/seed.ts';
import { schemaSetup } from '../../src/agent/schema-status.ts';
import { StatusStore } from '../../src/agent/status-store.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { renderStatusPage } from '../../src/http/status-page.ts';

const SCHEMA_CODES = new Set([
  'CLOUDCONFIG_SCHEMA',
  'CLOUDCONFIG_DEPRECATED',
  'CLOUDCONFIG_UNCHECKED',
  'CLOUDCONFIG_SCHEMA_BUDGET',
  'CLOUD_INIT_VERSION_UNKNOWN',
]);

const checked = (release: '22.4' | '25.1' | 'off' = '25.1', dir = DEFAULT_SCHEMA_DIR): RenderOptions => ({
  ...DEFAULT_RENDER_OPTIONS,
  schemaCheck: { dir, release },
});

function vmi(annotation: string, version?: string): VmiObject {
  return {
    metadata: {
      name: 'vm',
      namespace: 'ns',
      uid: 'uid-1',
      annotations: {
        [ANNOTATION]: annotation,
        ...(version !== undefined ? { [CLOUD_INIT_VERSION_ANNOTATION]: version } : {}),
      },
    },
    spec: {},
  };
}

const inline = (userData: string) => `userData: ${JSON.stringify(userData)}`;

async function seedOf(v: VmiObject, options: RenderOptions, refs = new MemoryResolver()): Promise<Seed> {
  const out = await renderSeed(v, refs, options);
  assert.equal(out.kind, 'seed');
  return (out as { seed: Seed }).seed;
}

const schemaWarnings = (s: Seed): SeedWarning[] => s.warnings.filter((w) => SCHEMA_CODES.has(w.code));

test('runcmd given as a string: one CLOUDCONFIG_SCHEMA warning naming path, module and release, not the value', async () => {
  const seed = await seedOf(vmi(inline('#cloud-config\nruncmd: "echo hi"\n')), checked());
  const ws = schemaWarnings(seed);
  assert.equal(ws.length, 1, JSON.stringify(ws));
  const [w] = ws;
  assert.equal(w.code, 'CLOUDCONFIG_SCHEMA');
  assert.equal(w.message, "user-data: runcmd: a string is not of type 'array' (cloud-init 25.1, cc_runcmd)");
  assert.deepEqual(w.schema, {
    document: 'user-data',
    path: 'runcmd',
    module: 'cc_runcmd',
    severity: 'error',
    release: '25.1',
  });
  assert.ok(!w.message.includes('echo hi'));
  // The seed is the same with or without the check.
  const plain = await seedOf(vmi(inline('#cloud-config\nruncmd: "echo hi"\n')), DEFAULT_RENDER_OPTIONS);
  assert.deepEqual(Buffer.from(seed.userData), Buffer.from(plain.userData));
  assert.deepEqual(schemaWarnings(plain), []);
});

test("the annotation picks the release: an unknown top-level key is an error in 25.1's schema only", async () => {
  const ud = inline('#cloud-config\nbogus: 1\n');
  const paths = async (version: string | undefined, node: '22.4' | '25.1' = '25.1') =>
    schemaWarnings(await seedOf(vmi(ud, version), checked(node))).map((w) => [
      w.code,
      w.schema?.path,
      w.schema?.release,
    ]);
  assert.deepEqual(await paths('25.1', '22.4'), [['CLOUDCONFIG_SCHEMA', 'bogus', '25.1']]);
  assert.deepEqual(await paths(undefined), [['CLOUDCONFIG_SCHEMA', 'bogus', '25.1']]);
  assert.deepEqual(await paths('22.4'), []);
  assert.deepEqual(await paths(undefined, '22.4'), []);
});

test("annotation 'off' and the node's release 'off' check nothing", async () => {
  const ud = inline('#cloud-config\nruncmd: "echo hi"\n');
  assert.deepEqual(schemaWarnings(await seedOf(vmi(ud, 'off'), checked())), []);
  assert.deepEqual(schemaWarnings(await seedOf(vmi(ud), checked('off'))), []);
});

test('an unknown annotation value is CLOUD_INIT_VERSION_UNKNOWN, and the node default is used', async () => {
  const seed = await seedOf(vmi(inline('#cloud-config\nruncmd: "echo hi"\n'), '23.4'), checked());
  const ws = schemaWarnings(seed);
  assert.deepEqual(
    ws.map((w) => w.code),
    ['CLOUD_INIT_VERSION_UNKNOWN', 'CLOUDCONFIG_SCHEMA'],
  );
  assert.equal(ws[0].field, `metadata.annotations.${CLOUD_INIT_VERSION_ANNOTATION}`);
  assert.match(ws[0].message, /"22\.4", "25\.1", "off"/);
  assert.match(ws[0].message, /node's default release/);
  assert.equal(ws[1].schema?.release, '25.1');
});

test('a missing schema directory: CLOUDCONFIG_UNCHECKED, and the seed still renders', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-no-schemas-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const seed = await seedOf(vmi(inline('#cloud-config\nruncmd: "echo hi"\n')), checked('25.1', join(dir, 'none')));
  const ws = schemaWarnings(seed);
  assert.deepEqual(
    ws.map((w) => w.code),
    ['CLOUDCONFIG_UNCHECKED'],
  );
  assert.match(ws[0].message, /^user-data: not checked against cloud-init 25\.1's schema: /);
  assert.ok(seed.userData.length > 0);
});

test('a check that fails (the worker pool) is a warning, logged without content, never a failed seed', async () => {
  const logged: Array<[Record<string, unknown>, string]> = [];
  const failing: Offload = {
    run: async (op, args, bytes, signal) => {
      if (op === 'checkSchemas') throw Object.assign(new Error('queue full: echo hi'), { code: 'RENDER_QUEUE_FULL' });
      return INLINE_OFFLOAD.run(op, args, bytes, signal);
    },
  };
  const options: RenderOptions = {
    ...DEFAULT_RENDER_OPTIONS,
    offload: failing,
    schemaCheck: { dir: DEFAULT_SCHEMA_DIR, release: '25.1', warn: (f, m) => logged.push([f, m]) },
  };
  const seed = await seedOf(vmi(inline('#cloud-config\nruncmd: "echo hi"\n')), options);
  const ws = schemaWarnings(seed);
  assert.deepEqual(
    ws.map((w) => w.code),
    ['CLOUDCONFIG_UNCHECKED'],
  );
  assert.match(ws[0].message, /RENDER_QUEUE_FULL/);
  assert.equal(logged.length, 1);
  assert.ok(!JSON.stringify(logged).includes('echo hi'));
});

test("a Secret's value that fails a type check: the warning names the path, never the value", async () => {
  const secret = 'Sup3rSecretValue';
  const refs = new MemoryResolver({
    secrets: [
      {
        metadata: { name: 's', namespace: 'ns' },
        stringData: {
          userdata: `#cloud-config\nchpasswd: {users: [{name: bob, password: [${secret}], type: text}]}\n`,
        },
      },
    ],
  });
  const seed = await seedOf(vmi('secretRef: {name: s}'), checked(), refs);
  const ws = schemaWarnings(seed);
  assert.ok(ws.length > 0);
  assert.ok(
    ws.every((w) => w.schema?.path.startsWith('chpasswd.users.0')),
    JSON.stringify(ws),
  );
  assert.ok(!JSON.stringify(seed.warnings).includes(secret));
});

test('the agent: schema status line and info metric; schema problems counted by module while the VMI shows them', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-no-schemas-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const ready = schemaSetup(DEFAULT_SCHEMA_DIR, '25.1');
  assert.equal(ready.release, '25.1');
  assert.match(ready.line, /^25\.1 ready \([^)]+\); 22\.4 (ready|off)/);
  const missing = schemaSetup(dir, '25.1');
  assert.equal(missing.release, 'off');
  assert.match(missing.line, /^25\.1 off: .*release\.json is missing; .*seeds not checked/);
  assert.equal(schemaSetup(DEFAULT_SCHEMA_DIR, 'off').release, 'off');

  const metrics = createMetrics({ version: 'test', processMetrics: false });
  for (const s of missing.statuses) metrics.cloudInitSchemaInfo.set({ release: s.release, state: s.state }, 1);
  const store = new StatusStore({
    version: 'test',
    nodeName: 'node-a',
    stateDir: dir,
    config: {},
    metrics,
    watch: () => ({ mode: 'local', synced: true, connected: true, stale: false, restarts: 0 }),
    queue: () => ({ depth: 0, inFlight: 0 }),
  });
  store.setCloudInitSchemas(missing.line);
  const seed = await seedOf(vmi(inline('#cloud-config\nruncmd: "echo hi"\nbogus: 1\n')), checked());
  const warnings = seed.warnings.map((w) => ({
    code: w.code,
    message: w.message,
    ...(w.schema ? { schema: w.schema } : {}),
  }));
  store.write('ns/vm', 'uid-1', { kind: 'served', datasource: 'nocloud', warnings });
  const text = await metrics.registry.metrics();
  assert.match(text, /vmseed_cloud_init_schema_info\{release="25\.1",state="off"\} 1/);
  assert.match(text, /vmseed_seed_schema_problems\{module="cc_runcmd",severity="error"\} 1/);
  assert.match(text, /vmseed_seed_schema_problems\{module="unknown",severity="error"\} 1/);

  const snap = store.snapshot();
  assert.deepEqual(
    snap.vmis[0].warnings.map((w) => w.schema?.module),
    ['unknown', 'cc_runcmd'],
  );
  const html = renderStatusPage(snap, { now: new Date() });
  assert.ok(html.includes('cloud-init schemas: 25.1 off: '), 'the status page line');
  assert.ok(html.includes('runcmd: a string is not of type'));

  // Fixed: the count goes back to 0.
  store.write('ns/vm', 'uid-1', { kind: 'served', datasource: 'nocloud', warnings: [] });
  assert.match(
    await metrics.registry.metrics(),
    /vmseed_seed_schema_problems\{module="cc_runcmd",severity="error"\} 0/,
  );
  store.write('ns/vm', 'uid-1', { kind: 'served', datasource: 'nocloud', warnings });
  store.records.end('ns/vm');
  assert.match(await metrics.registry.metrics(), /vmseed_seed_schema_problems\{module="unknown",severity="error"\} 0/);
});

test("vendor-data is checked as the VMI gave it (not vmseed's reporting wrapper); MIME parts are named; network-config too", async () => {
  const mime = [
    'Content-Type: multipart/mixed; boundary="XX"',
    'MIME-Version: 1.0',
    '',
    '--XX',
    'Content-Type: text/x-shellscript',
    '',
    '#!/bin/sh',
    'true',
    '--XX',
    'Content-Type: text/cloud-config; charset="us-ascii"',
    'Content-Disposition: attachment; filename="x.yaml"',
    '',
    '#cloud-config',
    'runcmd: "echo hi"',
    '--XX--',
    '',
  ].join('\n');
  const annotation = [
    inline(mime),
    `vendorData: ${JSON.stringify('#cloud-config\npackages: "vim"\n')}`,
    `networkData: ${JSON.stringify('version: 2\nethernets: {eth0: {dhcp4: "maybe"}}\n')}`,
  ].join('\n');
  const out = await renderSeed(vmi(annotation), new MemoryResolver(), checked(), {
    reportUrl: 'http://10.0.0.1:8100/v1/report/token',
  });
  assert.equal(out.kind, 'seed');
  const seed = (out as { seed: Seed }).seed;
  const ws = schemaWarnings(seed).filter((w) => w.code === 'CLOUDCONFIG_SCHEMA');
  const byDoc = (d: string) => ws.filter((w) => w.schema?.document === d);
  assert.equal(byDoc('user-data').length, 1, JSON.stringify(ws));
  assert.match(byDoc('user-data')[0].message, /^user-data part 2 \(x\.yaml\): runcmd: /);
  assert.equal(byDoc('user-data')[0].schema?.part, 'part 2 (x.yaml)');
  assert.deepEqual(
    byDoc('vendor-data').map((w) => [w.schema?.path, w.schema?.module]),
    [['packages', 'cc_package_update_upgrade_install']],
  );
  assert.ok(byDoc('network-config').length > 0, JSON.stringify(ws));
  assert.ok(byDoc('network-config').every((w) => w.schema?.module === 'network-config'));
  assert.ok(!JSON.stringify(seed.warnings).includes('maybe'));
});

test("ConfigDrive's network_data.json is OpenStack's format: not checked against cloud-init's network schemas", async () => {
  const annotation = [
    'datasource: configdrive',
    inline('#cloud-config\nruncmd: "echo hi"\n'),
    `networkData: ${JSON.stringify('version: 2\nethernets: {eth0: {dhcp4: true}}\n')}`,
  ].join('\n');
  const seed = await seedOf(vmi(annotation), checked());
  assert.ok(seed.networkConfig && seed.networkConfig.length > 0);
  assert.deepEqual(
    schemaWarnings(seed).map((w) => w.schema?.document),
    ['user-data'],
  );
});
