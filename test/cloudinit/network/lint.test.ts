import { test } from 'node:test';
import assert from 'node:assert/strict';
import { lintNetworkData } from '../../../src/cloudinit/network/network-lint.ts';

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

const text = (s: string, ds: 'nocloud' | 'configdrive') => Buffer.from(lintNetworkData(b(s), ds, 'f')).toString('utf8');

test('network_data.json on NoCloud is converted to network-config v2', () => {
  const nd =
    '{"links": [{"id": "tap1", "type": "phy", "ethernet_mac_address": "FA:16:3E:00:00:01"}], ' +
    '"networks": [{"id": "n0", "link": "tap1", "type": "ipv4_dhcp"}], "services": [{"type": "dns", "address": "192.0.2.53"}]}';
  assert.equal(
    text(nd, 'nocloud'),
    'version: 2\nethernets:\n  tap1:\n    match:\n      macaddress: fa:16:3e:00:00:01\n    dhcp4: true\n    nameservers:\n      addresses:\n        - 192.0.2.53\n',
  );
  assert.equal(
    code('{"links": [{"id": "b", "type": "bond", "bond_links": []}], "networks": [], "services": []}', 'nocloud'),
    'NETWORK_CONVERSION_UNSUPPORTED',
  );
});

test('ConfigDrive accepts network_data.json, converts YAML v1/v2, rejects junk', () => {
  const nd = '{"links": [], "networks": [], "services": []}';
  assert.equal(text(nd, 'configdrive'), nd);
  assert.equal(text('version: 1\nconfig: []\n', 'configdrive'), '{"links":[],"networks":[],"services":[]}');
  assert.equal(text('network: {version: 2}\n', 'configdrive'), '{"links":[],"networks":[],"services":[]}');
  assert.equal(code('network: {config: disabled}\n', 'configdrive'), 'NETWORKDATA_UNSUPPORTED_FOR_DATASOURCE');
  assert.equal(
    code('version: 2\nbridges: {br0: {interfaces: [eth0]}}\n', 'configdrive'),
    'NETWORK_CONVERSION_UNSUPPORTED',
  );
  assert.equal(code('{"links": {}}', 'configdrive'), 'NETWORKDATA_INVALID');
  assert.equal(code('[1, 2]', 'configdrive'), 'NETWORKDATA_INVALID');
});

test('network data that is not UTF-8 is rejected', () => {
  assert.throws(() => lintNetworkData(new Uint8Array([0xff, 0xfe, 0x00]), 'nocloud', 'f'), {
    code: 'NETWORKDATA_INVALID',
  });
});
