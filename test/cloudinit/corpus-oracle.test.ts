// cloud-init itself (Debian package, /usr/bin/python3) reads every seed of the
// corpus: each #cloud-config passes its strict schema validation, each
// network-config goes through parse_net_config_data, each NoCloud seed is read
// with pathprefix2dict + load_yaml as DataSourceNoCloud does, and each
// ConfigDrive seed through ConfigDriveReader.read_v2. One Python process for
// the whole corpus.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import type { Seed } from '../../src/cloudinit/seed.ts';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import { detectUserDataKind } from '../../src/cloudinit/userdata/user-data-lint.ts';
import { caseNames, runCase, runOracle, type OracleRequest, type OracleResponse } from './corpus-lib.ts';

const seeds = new Map<string, Seed>();
const req: Required<OracleRequest> = {
  cloudConfigs: [],
  mimes: [],
  networkConfigs: [],
  noCloudDirs: [],
  configDrives: [],
  networkRenders: [],
  passwords: [],
};
let tmp = '';
let res: OracleResponse;

// Negative controls: if these passed, the oracle would prove nothing.
const MUST_FAIL_CLOUD_CONFIG = {
  'control-schema-type': '#cloud-config\nruncmd: 5\n',
  'control-schema-enum': '#cloud-config\npower_state: {mode: sideways}\n',
  'control-not-a-mapping': '#cloud-config\n- a\n- b\n',
  'control-bad-yaml': '#cloud-config\nusers:\n  - name: ops\n   groups: wheel\n',
};
const MUST_FAIL_NETWORK = {
  'control-no-version': 'ethernets:\n  eth0: {dhcp4: true}\n',
  'control-v1-no-name': 'version: 1\nconfig:\n  - {type: physical, subnets: [{type: dhcp}]}\n',
  'control-v3': 'version: 3\n',
};

// A seed vmseed writes as given with a warning (KubeVirt's volumes): cloud-init
// must disagree with the data exactly where vmseed warned, and still read the seed.
function warned(id: string, code: string): boolean {
  return (seeds.get(id.replace(/^vendor:/, ''))?.warnings ?? []).some((w) => w.code === code);
}

function isJson(b: Uint8Array): boolean {
  try {
    JSON.parse(Buffer.from(b).toString('utf8'));
    return true;
  } catch {
    return false;
  }
}

// "0", "1", … → the list cloud-init installs, in that order.
function keysInOrder(m: unknown): string[] {
  const rec = (m ?? {}) as Record<string, string>;
  return Object.keys(rec)
    .sort((a, b) => Number(a) - Number(b))
    .map((k) => rec[k]);
}

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'vmseed-corpus-'));
  for (const name of caseNames()) {
    const r = await runCase(name);
    if (!('outcome' in r) || r.outcome.kind !== 'seed') continue;
    const seed = r.outcome.seed;
    seeds.set(name, seed);
    const dir = join(tmp, name);
    for (const f of serializeMetaData(seed)) {
      mkdirSync(dirname(join(dir, f.path)), { recursive: true });
      writeFileSync(join(dir, f.path), f.bytes);
    }
    (seed.datasource === 'nocloud' ? req.noCloudDirs : req.configDrives).push({ id: name, dir });
    const { kind, payload } = detectUserDataKind(seed.userData);
    const text = Buffer.from(payload).toString('utf8');
    if (kind === '#cloud-config') req.cloudConfigs.push({ id: name, text });
    if (kind === 'mime') req.mimes.push({ id: name, text });
    if (seed.vendorData) {
      // Vendor-data is processed like user-data: its #cloud-config must pass the schema too.
      const raw = Buffer.from(seed.vendorData).toString('utf8');
      const vd =
        seed.datasource === 'nocloud' ? raw : String((JSON.parse(raw) as Record<string, unknown>)['cloud-init']);
      const v = detectUserDataKind(new Uint8Array(Buffer.from(vd)));
      if (v.kind === '#cloud-config') req.cloudConfigs.push({ id: `vendor:${name}`, text: vd });
    }
    if (seed.datasource === 'nocloud' && seed.networkConfig) {
      req.networkConfigs.push({ id: name, text: Buffer.from(seed.networkConfig).toString('utf8') });
    }
  }
  for (const [id, text] of Object.entries(MUST_FAIL_CLOUD_CONFIG)) req.cloudConfigs.push({ id, text });
  for (const [id, text] of Object.entries(MUST_FAIL_NETWORK)) req.networkConfigs.push({ id, text });
  res = runOracle(req);
});

after(() => rmSync(tmp, { recursive: true, force: true }));

test('the corpus feeds the oracles enough material', () => {
  assert.ok(
    res.configDrives.some((r) => (r.sshKeys ?? []).length >= 2),
    'no ConfigDrive case with keys',
  );
  assert.ok(
    res.noCloudDirs.some((r) => (r.sshKeys ?? []).length >= 4),
    'no NoCloud case with several keys',
  );
  assert.ok(req.cloudConfigs.length >= 30, `${req.cloudConfigs.length} cloud-configs`);
  assert.ok(req.networkConfigs.length >= 10, `${req.networkConfigs.length} network-configs`);
  assert.ok(req.configDrives.length >= 6, `${req.configDrives.length} config drives`);
  assert.ok(req.mimes.length >= 1);
  assert.ok(
    res.configDrives.some((r) => r.vendordata),
    'no ConfigDrive case with vendor-data',
  );
  assert.ok(
    res.noCloudDirs.some((r) => r.vendordata),
    'no NoCloud case with vendor-data',
  );
  assert.ok(req.cloudConfigs.filter((c) => c.id.startsWith('vendor:')).length >= 3, 'too few vendor cloud-configs');
});

test('every #cloud-config in the corpus passes cloud-init strict schema validation; broken ones fail', () => {
  for (const r of [...res.cloudConfigs, ...res.mimes]) {
    if (r.id.startsWith('control-') || warned(r.id, 'USERDATA_CLOUDCONFIG_INVALID'))
      assert.equal(r.ok, false, `${r.id} should fail cloud-init's check`);
    else assert.ok(r.ok, `${r.id}: ${r.error}`);
  }
});

test('every network-config is accepted by parse_net_config_data; broken ones are not', () => {
  for (const r of res.networkConfigs) {
    if (r.id.startsWith('control-') || warned(r.id, 'NETWORKDATA_UNPARSED')) {
      assert.equal(r.ok, false, `${r.id} should fail`);
      continue;
    }
    assert.ok(r.ok, `${r.id}: ${r.error}`);
    assert.ok(r.interfaces && r.interfaces.length > 0, `${r.id}: no interfaces`);
  }
});

test('every NoCloud seed is read by cloud-init with its instance-id, hostname, keys and user-data', () => {
  for (const r of res.noCloudDirs) {
    const seed = seeds.get(r.id)!;
    assert.ok(r.ok, `${r.id}: ${r.error}`);
    assert.equal(r.instanceId, seed.metaData['instance-id'], r.id);
    // Generated ids are UUIDs; `metaData` may set its own (Virtlet cases).
    if (!r.id.startsWith('vt-metadata'))
      assert.match(r.instanceId!, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    assert.equal(r.hostname, seed.metaData['local-hostname'], r.id);
    assert.deepEqual(r.publicKeys ?? undefined, seed.metaData['public-keys'], r.id);
    assert.deepEqual(r.sshKeys, keysInOrder(seed.metaData['public-keys']), r.id);
    assert.deepEqual(Buffer.from(r.userdata!, 'base64'), Buffer.from(seed.userData), r.id);
    assert.equal(r.hasNetworkConfig, seed.networkConfig !== undefined, r.id);
    assert.equal(
      r.vendordata ?? undefined,
      seed.vendorData ? Buffer.from(seed.vendorData).toString('utf8') : undefined,
      r.id,
    );
  }
});

test('seeds with unparseable network data or cloud-config are in the corpus, and cloud-init reads them', () => {
  const unparsed = res.noCloudDirs.filter((r) => warned(r.id, 'NETWORKDATA_UNPARSED'));
  assert.ok(unparsed.length >= 3, `${unparsed.length} NoCloud seeds with unparsed network data`);
  for (const r of unparsed) {
    assert.ok(r.ok, `${r.id}: ${r.error}`);
    assert.match(Buffer.from(r.userdata!, 'base64').toString('utf8'), /^#cloud-config\n/, r.id);
  }
  assert.ok(res.configDrives.some((r) => r.ok && warned(r.id, 'NETWORKDATA_UNPARSED')));
  assert.ok(
    res.configDrives.some((r) => !r.ok && warned(r.id, 'NETWORKDATA_UNPARSED')),
    'a ConfigDrive with non-JSON network data',
  );
  assert.ok(res.cloudConfigs.some((r) => warned(r.id, 'USERDATA_CLOUDCONFIG_INVALID')));
});

test('every ConfigDrive seed is read by ConfigDriveReader.read_v2 with the expected instance-id and keys', () => {
  assert.equal(res.configDrives.length, req.configDrives.length);
  for (const r of res.configDrives) {
    const seed = seeds.get(r.id)!;
    if (warned(r.id, 'NETWORKDATA_UNPARSED') && !isJson(seed.networkConfig!)) {
      // Written as given, like KubeVirt: cloud-init rejects the whole drive,
      // which is what the warning tells the user.
      assert.equal(r.ok, false, `${r.id}: cloud-init read a drive with non-JSON network_data.json`);
      assert.match(r.error!, /network_data\.json/, r.id);
      continue;
    }
    assert.ok(r.ok, `${r.id}: ${r.error}`);
    assert.equal(r.instanceId, seed.metaData.uuid, r.id);
    assert.equal(r.hostname, seed.metaData.hostname, r.id);
    assert.deepEqual(r.publicKeys ?? undefined, seed.metaData.public_keys, r.id);
    assert.deepEqual(r.sshKeys, keysInOrder(seed.metaData.public_keys), r.id);
    assert.deepEqual(Buffer.from(r.userdata!, 'base64'), Buffer.from(seed.userData), r.id);
    if (seed.networkConfig) {
      assert.deepEqual(r.networkdata, JSON.parse(Buffer.from(seed.networkConfig).toString('utf8')), r.id);
      // JSON that is not network_data.json: read, user-data applied, no interfaces from it.
      if (warned(r.id, 'NETWORKDATA_UNPARSED')) assert.deepEqual(r.interfaces ?? [], [], r.id);
      else assert.ok(r.interfaces && r.interfaces.length > 0, `${r.id}: network_data.json gave no interfaces`);
    } else {
      assert.equal(r.networkdata ?? null, null, r.id);
    }
    // vendor_data.json as cloud-init's convert_vendordata reads it: the "cloud-init" member.
    const vd = seed.vendorData
      ? (JSON.parse(Buffer.from(seed.vendorData).toString('utf8')) as Record<string, string>)['cloud-init']
      : null;
    assert.equal(r.vendordata ?? null, vd, r.id);
  }
});
