// The network converters on their own: address helpers, what each reader
// accepts and refuses, and that emitted documents are stable.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { convertNetworkConfigToNetworkData } from '../../../src/cloudinit/network/convert-v1v2-to-nwdata.ts';
import { convertNetworkDataToV2 } from '../../../src/cloudinit/network/convert-nwdata-to-v2.ts';
import { modelToV2 } from '../../../src/cloudinit/network/emit-v2.ts';
import {
  emptyInterface,
  isIp,
  netmaskToPrefix,
  normalizeMac,
  parseCidr,
  prefixToNetmask,
} from '../../../src/cloudinit/network/model.ts';

const json = (b: Uint8Array) =>
  JSON.parse(Buffer.from(b).toString('utf8')) as Record<string, Array<Record<string, unknown>>>;

test('netmasks and prefixes round-trip for IPv4 and IPv6 as Nova prints them', () => {
  for (let p = 0; p <= 32; p++) assert.equal(netmaskToPrefix(prefixToNetmask(p, false)), p);
  for (let p = 0; p <= 128; p++) assert.equal(netmaskToPrefix(prefixToNetmask(p, true)), p);
  assert.equal(prefixToNetmask(64, true), 'ffff:ffff:ffff:ffff::');
  assert.equal(prefixToNetmask(0, true), '::');
  assert.equal(prefixToNetmask(128, true), 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff');
  assert.equal(prefixToNetmask(20, false), '255.255.240.0');
  assert.equal(netmaskToPrefix('255.0.255.0'), undefined);
  assert.equal(netmaskToPrefix('ffff::ffff'), undefined);
});

test('address and MAC parsing', () => {
  assert.ok(isIp('2001:db8::1') && isIp('::') && isIp('10.0.0.1') && isIp('fe80::1:2:3:4:5'));
  assert.ok(!isIp('10.0.0.256') && !isIp('2001:db8:::1') && !isIp('1:2:3:4:5:6:7:8:9') && !isIp('host'));
  assert.deepEqual(parseCidr('2001:db8::10/64'), { ip: '2001:db8::10', prefix: 64, v6: true });
  assert.equal(parseCidr('10.0.0.1/33'), undefined);
  assert.equal(normalizeMac('52:54:00:AB:CD:EF'), '52:54:00:ab:cd:ef');
  assert.equal(normalizeMac('52-54-00-ab-cd-ef'), undefined);
});

test('v2 routes "to: default" and gatewayN become default routes in network_data.json', () => {
  const nd = json(
    convertNetworkConfigToNetworkData(
      {
        version: 2,
        ethernets: {
          e: {
            match: { macaddress: '52:54:00:00:00:01' },
            addresses: ['192.0.2.5/24', '2001:db8::5/64'],
            gateway6: '2001:db8::1',
            routes: [{ to: 'default', via: '192.0.2.1' }],
          },
        },
      },
      'networkData',
    ),
  );
  const routes = nd.networks.flatMap((n) => (n.routes ?? []) as unknown[]);
  assert.deepEqual(routes, [
    { network: '0.0.0.0', netmask: '0.0.0.0', gateway: '192.0.2.1' },
    { network: '::', netmask: '::', gateway: '2001:db8::1' },
  ]);
});

test('v1/v2 features network_data.json cannot hold are refused by field', () => {
  const refuse = (doc: Record<string, unknown>, field: string) =>
    assert.throws(() => convertNetworkConfigToNetworkData(doc, 'nd'), {
      code: 'NETWORK_CONVERSION_UNSUPPORTED',
      field,
    });
  refuse({ version: 1, config: [{ type: 'vlan', name: 'v', vlan_link: 'eth0', vlan_id: 5 }] }, 'nd.config[0].type');
  refuse(
    { version: 1, config: [{ type: 'physical', name: 'eth0', subnets: [{ type: 'manual' }] }] },
    'nd.config[0].subnets[0].type',
  );
  refuse({ version: 1, config: [{ type: 'physical', name: 'eth0', 'accept-ra': true }] }, 'nd.config[0].accept-ra');
  refuse(
    { version: 1, config: [{ type: 'nameserver', address: ['1.1.1.1'], interface: 'eth0' }] },
    'nd.config[0].interface',
  );
  refuse({ version: 2, wifis: { w: {} } }, 'nd.wifis');
  refuse(
    {
      version: 2,
      ethernets: {
        e: { match: { macaddress: '52:54:00:00:00:01' }, dhcp4: true, 'dhcp4-overrides': { 'use-dns': false } },
      },
    },
    'nd.ethernets.e.dhcp4-overrides',
  );
  refuse(
    { version: 2, ethernets: { e: { dhcp4: true, routes: [{ to: '10.0.0.0/8', via: '192.0.2.1' }] } } },
    'nd.ethernets.e.routes',
  );
});

test('network_data.json readers follow convert_net_json: link name, MAC case, ip_address with CIDR, net gateway', () => {
  const v2 = convertNetworkDataToV2(
    {
      links: [{ id: 'l', type: 'phy', ethernet_mac_address: 'AA:BB:CC:DD:EE:FF', name: 'eth7', mtu: 9000 }],
      networks: [{ id: 'n', link: 'l', type: 'ipv4', ip_address: '10.1.2.3/16', gateway: '10.1.0.1' }],
      services: [],
    },
    'nd',
  );
  assert.equal(
    Buffer.from(v2).toString(),
    'version: 2\nethernets:\n  l:\n    match:\n      macaddress: aa:bb:cc:dd:ee:ff\n    set-name: eth7\n    mtu: 9000\n    addresses:\n      - 10.1.2.3/16\n    gateway4: 10.1.0.1\n',
  );
  assert.throws(
    () =>
      convertNetworkDataToV2(
        {
          links: [{ id: 'l', type: 'phy', ethernet_mac_address: '52:54:00:00:00:01' }],
          networks: [{ id: 'n', link: 'nope', type: 'ipv4_dhcp' }],
        },
        'nd',
      ),
    { code: 'NETWORKDATA_INVALID', field: 'nd.networks[0].link' },
  );
  assert.throws(
    () => convertNetworkDataToV2({ links: [], networks: [], services: [{ type: 'ntp', address: '1.2.3.4' }] }, 'nd'),
    { code: 'NETWORK_CONVERSION_UNSUPPORTED', field: 'nd.services[0].type' },
  );
});

test('v2 emission: default routes become gatewayN only when a static address of the family exists', () => {
  const nic = {
    ...emptyInterface('e'),
    mac: '52:54:00:00:00:01',
    dhcp4: true,
    routes: [{ to: '0.0.0.0/0', via: '192.0.2.1' }],
  };
  assert.deepEqual(
    (
      modelToV2({ interfaces: [nic], dns: { servers: [], search: [] } }).ethernets as Record<
        string,
        Record<string, unknown>
      >
    ).e.routes,
    [{ to: '0.0.0.0/0', via: '192.0.2.1' }],
  );
  const stat = { ...nic, addresses: ['192.0.2.9/24'] };
  const e = (
    modelToV2({ interfaces: [stat], dns: { servers: [], search: [] } }).ethernets as Record<
      string,
      Record<string, unknown>
    >
  ).e;
  assert.equal(e.gateway4, '192.0.2.1');
  assert.equal(e.routes, undefined);
});
