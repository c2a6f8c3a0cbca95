import { test } from 'node:test';
import assert from 'node:assert/strict';
import { metaDataBytes, serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import type { Seed } from '../../src/cloudinit/seed.ts';

const b = (s: string) => new Uint8Array(Buffer.from(s));
const base: Seed = {
  datasource: 'nocloud',
  metaData: { 'instance-id': 'i', 'local-hostname': 'h' },
  userData: new Uint8Array(),
  warnings: [],
};

test('NoCloud: meta-data and user-data always (user-data even empty), the rest only when non-empty', () => {
  assert.deepEqual(
    serializeMetaData(base).map((f) => f.path),
    ['meta-data', 'user-data'],
  );
  const full = { ...base, networkConfig: b('version: 2\n'), vendorData: b('#cloud-config\n{}\n') };
  assert.deepEqual(
    serializeMetaData(full).map((f) => f.path),
    ['meta-data', 'user-data', 'network-config', 'vendor-data'],
  );
  assert.deepEqual(
    serializeMetaData({ ...base, networkConfig: new Uint8Array() }).map((f) => f.path),
    ['meta-data', 'user-data'],
  );
});

test('ConfigDrive: the openstack/latest tree', () => {
  const cd: Seed = {
    ...base,
    datasource: 'configdrive',
    metaData: { uuid: 'u' },
    networkConfig: b('{}'),
    vendorData: b('{}'),
  };
  assert.deepEqual(
    serializeMetaData(cd).map((f) => f.path),
    [
      'openstack/latest/meta_data.json',
      'openstack/latest/user_data',
      'openstack/latest/network_data.json',
      'openstack/latest/vendor_data.json',
    ],
  );
});

test('meta-data is compact JSON without a trailing newline', () => {
  assert.equal(Buffer.from(metaDataBytes(base)).toString(), '{"instance-id":"i","local-hostname":"h"}');
  assert.deepEqual(serializeMetaData(base)[0].bytes, metaDataBytes(base));
});
