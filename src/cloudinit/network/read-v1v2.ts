// network-config v1 / v2 → NetModel, for writing network_data.json. Only
// physical interfaces with DHCP, SLAAC, static addresses, routes, MTU and
// DNS fit network_data.json as cloud-init reads it; anything else (bonds,
// bridges, VLANs, wifi, match by driver, unknown keys) is refused by name so
// the conversion never loses a setting silently.
import { VmseedError } from '../../errors.ts';
import { isPlainObject } from '../yaml.ts';
import {
  emptyInterface,
  isIp,
  isV6,
  type NetInterface,
  type NetModel,
  netmaskToPrefix,
  normalizeMac,
  parseCidr,
} from './model.ts';

function unsupported(field: string, what: string): VmseedError {
  return new VmseedError(
    'NETWORK_CONVERSION_UNSUPPORTED',
    `${field}: ${what} cannot be expressed in OpenStack network_data.json, which ConfigDrive needs; ` +
      'remove it or use datasource nocloud',
    { kind: 'terminal', field },
  );
}

function invalid(field: string, what: string): VmseedError {
  return new VmseedError('NETWORKDATA_INVALID', `${field}: ${what}; fix the network config`, {
    kind: 'terminal',
    field,
  });
}

function onlyKeys(obj: Record<string, unknown>, known: readonly string[], field: string): void {
  for (const k of Object.keys(obj)) if (!known.includes(k)) throw unsupported(`${field}.${k}`, `the key "${k}"`);
}

const strList = (v: unknown, field: string): string[] => {
  if (v === undefined || v === null) return [];
  const list = typeof v === 'string' ? v.split(/[\s,]+/).filter(Boolean) : v;
  if (!Array.isArray(list) || !list.every((x) => typeof x === 'string'))
    throw invalid(field, 'must be a list of strings');
  return list;
};

function cidr(address: unknown, netmask: unknown, prefix: unknown, field: string): string {
  if (typeof address !== 'string') throw invalid(field, 'a static subnet needs "address"');
  if (parseCidr(address)) return address;
  if (!isIp(address)) throw invalid(field, 'address is not an IP address');
  if (typeof prefix === 'number') return `${address}/${prefix}`;
  if (typeof netmask === 'string') {
    const p = netmaskToPrefix(netmask);
    if (p === undefined) throw invalid(`${field}`, 'netmask is not a contiguous netmask');
    return `${address}/${p}`;
  }
  return `${address}/${isV6(address) ? 64 : 32}`;
}

const V1_SUBNET_KEYS = ['type', 'address', 'netmask', 'prefix', 'gateway', 'dns_nameservers', 'dns_search', 'routes'];
const V1_PHYSICAL_KEYS = ['type', 'name', 'mac_address', 'mtu', 'subnets'];

function v1(doc: Record<string, unknown>, field: string): NetModel {
  const model: NetModel = { interfaces: [], dns: { servers: [], search: [] } };
  const config = Array.isArray(doc.config) ? doc.config : [];
  config.forEach((item, i) => {
    const f = `${field}.config[${i}]`;
    if (!isPlainObject(item)) throw invalid(f, 'must be a mapping');
    if (item.type === 'nameserver') {
      onlyKeys(item, ['type', 'address', 'search', 'interface'], f);
      if (item.interface !== undefined) throw unsupported(`${f}.interface`, 'a nameserver bound to one interface');
      model.dns.servers.push(...strList(item.address, `${f}.address`));
      model.dns.search.push(...strList(item.search, `${f}.search`));
      return;
    }
    model.interfaces.push(v1Physical(item, f));
  });
  return model;
}

function v1Physical(item: Record<string, unknown>, f: string): NetInterface {
  if (item.type !== 'physical') throw unsupported(`${f}.type`, `a "${String(item.type)}" entry`);
  onlyKeys(item, V1_PHYSICAL_KEYS, f);
  if (typeof item.name !== 'string' || item.name === '') throw invalid(`${f}.name`, 'a physical entry needs "name"');
  const nic = emptyInterface(item.name);
  nic.name = item.name;
  if (item.mac_address !== undefined) {
    // Any YAML value, read by its text (an unquoted MAC can be a number).
    const mac = normalizeMac(String(item.mac_address));
    if (!mac) throw invalid(`${f}.mac_address`, 'not a MAC address (quote it: "52:54:00:12:34:56")');
    nic.mac = mac;
  }
  if (item.mtu !== undefined) nic.mtu = Number(item.mtu);
  const subnets = Array.isArray(item.subnets) ? item.subnets : [];
  subnets.forEach((s, j) => v1Subnet(s, `${f}.subnets[${j}]`, nic));
  return nic;
}

function v1Subnet(s: unknown, sf: string, nic: NetInterface): void {
  if (!isPlainObject(s)) throw invalid(sf, 'must be a mapping');
  onlyKeys(s, V1_SUBNET_KEYS, sf);
  switch (s.type) {
    case 'dhcp':
    case 'dhcp4':
      nic.dhcp4 = true;
      break;
    case 'dhcp6':
    case 'ipv6_dhcpv6-stateful':
      nic.dhcp6 = true;
      break;
    case 'ipv6_slaac':
    case 'ipv6_dhcpv6-stateless':
      nic.slaac = true;
      break;
    case 'static':
    case 'static6':
      nic.addresses.push(cidr(s.address, s.netmask, s.prefix, `${sf}.address`));
      break;
    default:
      throw unsupported(`${sf}.type`, `subnet type "${String(s.type)}"`);
  }
  if (typeof s.gateway === 'string') nic.routes.push({ to: isV6(s.gateway) ? '::/0' : '0.0.0.0/0', via: s.gateway });
  const routes = Array.isArray(s.routes) ? s.routes : [];
  routes.forEach((r, k) => {
    const rf = `${sf}.routes[${k}]`;
    if (!isPlainObject(r)) throw invalid(rf, 'must be a mapping');
    onlyKeys(r, ['network', 'destination', 'netmask', 'prefix', 'gateway'], rf);
    const net = r.network ?? r.destination;
    if (typeof net !== 'string' || typeof r.gateway !== 'string')
      throw invalid(rf, 'a route needs "network" and "gateway"');
    nic.routes.push({ to: cidr(net, r.netmask, r.prefix, rf), via: r.gateway });
  });
  nic.dnsServers.push(...strList(s.dns_nameservers, `${sf}.dns_nameservers`));
  nic.dnsSearch.push(...strList(s.dns_search, `${sf}.dns_search`));
}

const V2_ETHERNET_KEYS = [
  'match',
  'set-name',
  'dhcp4',
  'dhcp6',
  'accept-ra',
  'addresses',
  'gateway4',
  'gateway6',
  'routes',
  'nameservers',
  'mtu',
];

function v2(doc: Record<string, unknown>, field: string): NetModel {
  for (const k of ['bonds', 'bridges', 'vlans', 'wifis']) {
    if (doc[k] !== undefined && doc[k] !== null) throw unsupported(`${field}.${k}`, `"${k}"`);
  }
  onlyKeys(doc, ['version', 'ethernets', 'renderer'], field);
  const model: NetModel = { interfaces: [], dns: { servers: [], search: [] } };
  const eths = isPlainObject(doc.ethernets) ? doc.ethernets : {};
  for (const [id, raw] of Object.entries(eths)) {
    const f = `${field}.ethernets.${id}`;
    const e = isPlainObject(raw) ? raw : {};
    onlyKeys(e, V2_ETHERNET_KEYS, f);
    const nic: NetInterface = emptyInterface(id);
    if (e.match !== undefined) {
      if (!isPlainObject(e.match)) throw invalid(`${f}.match`, 'must be a mapping');
      onlyKeys(e.match, ['macaddress'], `${f}.match`);
      // Any YAML value, read by its text (an unquoted MAC can be a number).
      const mac = normalizeMac(String(e.match.macaddress ?? ''));
      if (!mac) throw invalid(`${f}.match.macaddress`, 'not a MAC address');
      nic.mac = mac;
      if (typeof e['set-name'] === 'string') nic.name = e['set-name'];
    } else {
      // Without match, the id is the interface name.
      nic.name = typeof e['set-name'] === 'string' ? e['set-name'] : id;
    }
    nic.dhcp4 = e.dhcp4 === true || e.dhcp4 === 'true' || e.dhcp4 === 'yes';
    nic.dhcp6 = e.dhcp6 === true || e.dhcp6 === 'true' || e.dhcp6 === 'yes';
    nic.slaac = e['accept-ra'] === true;
    if (e.mtu !== undefined) nic.mtu = Number(e.mtu);
    for (const a of strList(e.addresses, `${f}.addresses`)) {
      if (!parseCidr(a)) throw invalid(`${f}.addresses`, 'addresses must be in CIDR form (192.0.2.10/24)');
      nic.addresses.push(a);
    }
    if (typeof e.gateway4 === 'string') nic.routes.push({ to: '0.0.0.0/0', via: e.gateway4 });
    if (typeof e.gateway6 === 'string') nic.routes.push({ to: '::/0', via: e.gateway6 });
    const routes = Array.isArray(e.routes) ? e.routes : [];
    routes.forEach((r, k) => {
      const rf = `${f}.routes[${k}]`;
      if (!isPlainObject(r)) throw invalid(rf, 'must be a mapping');
      onlyKeys(r, ['to', 'via', 'metric'], rf);
      if (typeof r.to !== 'string' || typeof r.via !== 'string') throw invalid(rf, 'a route needs "to" and "via"');
      const to = r.to === 'default' ? (isV6(r.via) ? '::/0' : '0.0.0.0/0') : r.to;
      nic.routes.push({ to, via: r.via, ...(typeof r.metric === 'number' ? { metric: r.metric } : {}) });
    });
    if (e.nameservers !== undefined) {
      if (!isPlainObject(e.nameservers)) throw invalid(`${f}.nameservers`, 'must be a mapping');
      onlyKeys(e.nameservers, ['addresses', 'search'], `${f}.nameservers`);
      nic.dnsServers.push(...strList(e.nameservers.addresses, `${f}.nameservers.addresses`));
      nic.dnsSearch.push(...strList(e.nameservers.search, `${f}.nameservers.search`));
    }
    model.interfaces.push(nic);
  }
  return model;
}

// `doc` is the network-config document, already unwrapped from "network:".
export function networkConfigToModel(doc: Record<string, unknown>, field: string): NetModel {
  if (doc.version === 1) return v1(doc, field);
  if (doc.version === 2) return v2(doc, field);
  throw invalid(field, 'network-config must declare "version: 1" or "version: 2"');
}
