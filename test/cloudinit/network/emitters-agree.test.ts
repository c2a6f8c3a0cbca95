// Property: for random network setups (the shapes init.nics can ask for),
// the network-config v2 vmseed writes for NoCloud and the network_data.json
// it writes for ConfigDrive mean the same to cloud-init (parsed by its own
// code in one Python process; network_data.json through convert_net_json),
// and reading either back gives the setup again.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { modelToNetworkData, networkDataBytes } from '../../../src/cloudinit/network/emit-nwdata.ts';
import { modelToV2Bytes, withGlobalDnsOnInterfaces } from '../../../src/cloudinit/network/emit-v2.ts';
import { emptyInterface, type NetInterface, type NetModel } from '../../../src/cloudinit/network/model.ts';
import { networkDataToModel } from '../../../src/cloudinit/network/read-nwdata.ts';
import { runOracle } from '../corpus-lib.ts';
import { meaning } from '../network-meaning.ts';

const octet = fc.integer({ min: 1, max: 254 });
const v4 = fc.tuple(octet, octet, octet, octet).map((o) => o.join('.'));
const v6 = fc
  .tuple(fc.integer({ min: 1, max: 0xffff }), fc.integer({ min: 1, max: 0xffff }))
  .map(([a, b]) => `2001:db8:${a.toString(16)}::${b.toString(16)}`);

const nicArb = (i: number) =>
  fc
    .record({
      name: fc.option(fc.constantFrom('eth0', 'ens3', 'enp1s0', 'lan'), { nil: undefined }),
      mtu: fc.option(fc.integer({ min: 1280, max: 9000 }), { nil: undefined }),
      dhcp4: fc.boolean(),
      dhcp6: fc.boolean(),
      slaac: fc.boolean(),
      a4: fc.uniqueArray(fc.tuple(v4, fc.integer({ min: 8, max: 30 })), { maxLength: 2, selector: (x) => x[0] }),
      a6: fc.uniqueArray(fc.tuple(v6, fc.integer({ min: 48, max: 126 })), { maxLength: 2, selector: (x) => x[0] }),
      gw4: v4,
      gw6: v6,
      useGw: fc.boolean(),
      route4: fc.option(
        fc.tuple(
          fc.tuple(octet, octet).map(([a, b]) => `${a}.${b}.0.0/16`),
          v4,
        ),
        { nil: undefined },
      ),
    })
    .map((r): NetInterface => {
      const nic = emptyInterface(r.name ? `${r.name}` : `nic${i}`);
      nic.mac = `52:54:00:00:00:${(16 + i).toString(16)}`;
      if (r.name) nic.name = r.name;
      if (r.mtu !== undefined) nic.mtu = r.mtu;
      nic.dhcp4 = r.dhcp4;
      nic.dhcp6 = r.dhcp6;
      nic.slaac = r.slaac;
      nic.addresses = [...r.a4.map(([a, p]) => `${a}/${p}`), ...r.a6.map(([a, p]) => `${a}/${p}`)];
      if (r.useGw && r.a4.length > 0) nic.routes.push({ to: '0.0.0.0/0', via: r.gw4 });
      if (r.useGw && r.a6.length > 0) nic.routes.push({ to: '::/0', via: r.gw6 });
      if (r.route4 && r.a4.length > 0) nic.routes.push({ to: r.route4[0], via: r.route4[1] });
      if (!nic.dhcp4 && !nic.dhcp6 && !nic.slaac && nic.addresses.length === 0) nic.dhcp4 = true;
      return nic;
    });

const modelArb = fc.integer({ min: 1, max: 3 }).chain((n) =>
  fc
    .record({
      nics: fc.tuple(...Array.from({ length: n }, (_, i) => nicArb(i))),
      servers: fc.uniqueArray(fc.oneof(v4, v6), { maxLength: 2 }),
      search: fc.uniqueArray(fc.constantFrom('example.com', 'corp.example.org', 'lab'), { maxLength: 2 }),
    })
    .map(({ nics, servers, search }): NetModel => {
      // Distinct names: two NICs renamed alike is a config error of its own.
      const seen = new Set<string>();
      nics.forEach((nic, i) => {
        if (nic.name && seen.has(nic.name)) {
          delete nic.name;
          nic.id = `nic${i}`;
        }
        if (nic.name) seen.add(nic.name);
      });
      return { interfaces: nics, dns: { servers, search: servers.length > 0 ? search : [] } };
    }),
);

test('random setups: v2 and network_data.json mean the same to cloud-init, and network_data.json reads back', () => {
  const models = fc.sample(modelArb, { numRuns: 40, seed: 42 });
  const renders: Array<{ id: string; format: 'yaml' | 'network_data'; text: string }> = [];
  models.forEach((m, i) => {
    renders.push({
      id: `v2:${i}`,
      format: 'yaml',
      text: Buffer.from(modelToV2Bytes(withGlobalDnsOnInterfaces(m))).toString(),
    });
    const nd = modelToNetworkData(m, (k) => `nics[${k}]`);
    renders.push({ id: `nd:${i}`, format: 'network_data', text: Buffer.from(networkDataBytes(nd)).toString() });
    // The ConfigDrive reader gives back what was written (routes, DNS and all).
    const back = networkDataToModel(nd, 'nd');
    assert.deepEqual(back.dns, m.dns, `model ${i} dns`);
    assert.deepEqual(
      back.interfaces.map((x) => [x.mac, x.addresses, x.routes.length]),
      m.interfaces.map((x) => [x.mac, x.addresses, x.routes.length]),
      `model ${i}`,
    );
  });
  const res = runOracle({ networkRenders: renders });
  for (let i = 0; i < models.length; i++) {
    const a = res.networkRenders.find((r) => r.id === `v2:${i}`)!;
    const b = res.networkRenders.find((r) => r.id === `nd:${i}`)!;
    assert.ok(a.ok, `v2:${i} ${a.error}\n${renders[2 * i].text}`);
    assert.ok(b.ok, `nd:${i} ${b.error}\n${renders[2 * i + 1].text}`);
    assert.deepEqual(
      meaning(a.state!),
      meaning(b.state!),
      `model ${i}:\n${renders[2 * i].text}\n${renders[2 * i + 1].text}`,
    );
  }
});
