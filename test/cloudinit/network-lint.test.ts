import { test } from 'node:test';
import assert from 'node:assert/strict';
import { lintNetworkData } from '../../src/cloudinit/network-lint.ts';

const b = (s: string) => new Uint8Array(Buffer.from(s));
const code = (s: string, ds: 'nocloud' | 'configdrive') => {
  try {
    lintNetworkData(b(s), ds, 'networkData');
    return 'ok';
  } catch (e) {
    return (e as { code: string }).code;
  }
};

test('NoCloud accepts v1/v2 bare or under network:, rejects the rest', () => {
  assert.equal(code('version: 2\nethernets: {eth0: {dhcp4: true}}\n', 'nocloud'), 'ok');
  assert.equal(code('network:\n  version: 1\n  config: []\n', 'nocloud'), 'ok');
  assert.equal(code('network:\n  version: 2\nextra: 1\n', 'nocloud'), 'ok');
  assert.equal(code('network: 5\n', 'nocloud'), 'NETWORKDATA_INVALID');
  assert.equal(code('network: {config: disabled}\n', 'nocloud'), 'ok');
  assert.equal(code('config: disabled\n', 'nocloud'), 'ok');
  assert.equal(code('version: "2"\n', 'nocloud'), 'NETWORKDATA_INVALID');
  assert.equal(code('version: 2\nethernets: [eth0]\n', 'nocloud'), 'NETWORKDATA_INVALID');
  assert.equal(code('version: 1\nconfig: [{name: eth0}]\n', 'nocloud'), 'NETWORKDATA_INVALID');
  assert.equal(code('', 'nocloud'), 'NETWORKDATA_INVALID');
});

test('network_data.json on NoCloud says which datasource reads it', () => {
  assert.throws(() => lintNetworkData(b('{"links": [], "networks": [], "services": []}'), 'nocloud', 'f'), /only datasource configdrive/);
});

test('ConfigDrive accepts network_data.json, names YAML v1/v2 as unsupported, rejects junk', () => {
  assert.equal(code('{"links": [], "networks": [], "services": []}', 'configdrive'), 'ok');
  assert.equal(code('version: 1\nconfig: []\n', 'configdrive'), 'NETWORKDATA_UNSUPPORTED_FOR_DATASOURCE');
  assert.equal(code('network: {version: 2}\n', 'configdrive'), 'NETWORKDATA_UNSUPPORTED_FOR_DATASOURCE');
  assert.equal(code('{"links": {}}', 'configdrive'), 'NETWORKDATA_INVALID');
  assert.equal(code('[1, 2]', 'configdrive'), 'NETWORKDATA_INVALID');
});

test('network data that is not UTF-8 is rejected', () => {
  assert.throws(() => lintNetworkData(new Uint8Array([0xff, 0xfe, 0x00]), 'nocloud', 'f'), { code: 'NETWORKDATA_INVALID' });
});
