// OpenStack network_data.json → NetModel, reading it the way cloud-init's
// convert_net_json does (cloudinit/sources/helpers/openstack.py, 22.4):
// - every link becomes an interface; its `name` (a cloud-init extension) names
//   it, else the guest NIC with that MAC keeps its name;
// - networks attach to their link by `link`; ipv4_dhcp → dhcp4, ipv6_dhcp and
//   ipv6_dhcpv6-stateful → dhcp6 (with RA), ipv6_slaac and
//   ipv6_dhcpv6-stateless → RA, ipv4/static and ipv6/static6 → ip_address +
//   netmask (or a CIDR ip_address), with their routes;
// - services of type dns become global nameservers.
// Bonds and VLANs convert_net_json turns into bond/vlan devices are refused
// here by name rather than approximated.
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

// cloudinit/sources/helpers/openstack.py KNOWN_PHYSICAL_TYPES (None aside).
const PHYSICAL = new Set([
  'bgpovs',
  'bridge',
  'cascading',
  'dvs',
  'ethernet',
  'hw_veb',
  'hyperv',
  'ovs',
  'phy',
  'tap',
  'vhostuser',
  'vif',
]);

function unsupported(field: string, what: string): VmseedError {
  return new VmseedError(
    'NETWORK_CONVERSION_UNSUPPORTED',
    `${field}: ${what} has no network-config version 2 equivalent vmseed can write for NoCloud; ` +
      'write network-config v2 YAML yourself or use datasource configdrive',
    { kind: 'terminal', field },
  );
}

function invalid(field: string, what: string): VmseedError {
  return new VmseedError('NETWORKDATA_INVALID', `${field}: ${what}; fix network_data.json`, {
    kind: 'terminal',
    field,
  });
}

function cidrOf(ip: unknown, mask: unknown, field: string): string {
  if (typeof ip !== 'string') throw invalid(`${field}.ip_address`, 'a static network needs "ip_address"');
  if (parseCidr(ip)) return ip;
  if (!isIp(ip)) throw invalid(`${field}.ip_address`, 'ip_address is not an IP address');
  if (mask === undefined || mask === null) return `${ip}/${isV6(ip) ? 64 : 32}`;
  const prefix = typeof mask === 'string' ? netmaskToPrefix(mask) : undefined;
  if (prefix === undefined) throw invalid(`${field}.netmask`, 'netmask is not a contiguous netmask');
  return `${ip}/${prefix}`;
}

export function networkDataToModel(doc: unknown, field: string): NetModel {
  if (!isPlainObject(doc)) throw invalid(field, 'network_data.json must be a JSON object');
  const links = Array.isArray(doc.links) ? doc.links : [];
  const networks = Array.isArray(doc.networks) ? doc.networks : [];
  const services = Array.isArray(doc.services) ? doc.services : [];
  const model: NetModel = { interfaces: [], dns: { servers: [], search: [] } };
  const byId = new Map<string, NetInterface>();
  links.forEach((link, i) => {
    const nic = readLink(link, `${field}.links[${i}]`);
    byId.set(nic.id, nic);
    model.interfaces.push(nic);
  });
  networks.forEach((net, i) => readNetwork(net, `${field}.networks[${i}]`, byId));
  services.forEach((s, i) => {
    const f = `${field}.services[${i}]`;
    if (!isPlainObject(s)) throw invalid(f, 'each service must be an object');
    if (s.type !== 'dns') throw unsupported(`${f}.type`, `service type "${String(s.type)}"`);
    if (typeof s.address !== 'string' || !isIp(s.address))
      throw invalid(`${f}.address`, 'a dns service needs an IP "address"');
    model.dns.servers.push(s.address);
    if (Array.isArray(s.search)) model.dns.search.push(...s.search.map(String));
  });
  return model;
}

function readLink(link: unknown, f: string): NetInterface {
  if (!isPlainObject(link) || typeof link.id !== 'string') throw invalid(f, 'each link needs a string "id"');
  const type = link.type ?? null;
  if (type === 'bond' || type === 'vlan') throw unsupported(`${f}.type`, `a ${type} link`);
  // Any JSON value, named in the message as it reads.
  if (type !== null && !PHYSICAL.has(String(type))) throw unsupported(`${f}.type`, `link type "${String(type)}"`);
  const nic = emptyInterface(link.id);
  if (typeof link.ethernet_mac_address === 'string' && link.ethernet_mac_address !== '') {
    const mac = normalizeMac(link.ethernet_mac_address);
    if (!mac) throw invalid(`${f}.ethernet_mac_address`, 'not a MAC address');
    nic.mac = mac;
  }
  if (typeof link.name === 'string' && link.name !== '') nic.name = link.name;
  if (!nic.mac && !nic.name)
    throw invalid(f, 'a link needs "ethernet_mac_address" (or "name") for cloud-init to find the NIC');
  if (typeof link.mtu === 'number') nic.mtu = link.mtu;
  return nic;
}

// One network onto the interface of its link: addressing, routes, DNS.
function readNetwork(net: unknown, f: string, byId: Map<string, NetInterface>): void {
  if (!isPlainObject(net)) throw invalid(f, 'each network must be an object');
  const nic = byId.get(String(net.link));
  if (!nic) throw invalid(`${f}.link`, 'refers to no link id');
  readAddressing(net, nic, f);
  const routes = Array.isArray(net.routes) ? net.routes : [];
  routes.forEach((r, j) => {
    const rf = `${f}.routes[${j}]`;
    if (!isPlainObject(r) || typeof r.network !== 'string' || typeof r.gateway !== 'string') {
      throw invalid(rf, 'a route needs "network", "netmask" and "gateway"');
    }
    const prefix = typeof r.netmask === 'string' ? netmaskToPrefix(r.netmask) : undefined;
    if (prefix === undefined) throw invalid(`${rf}.netmask`, 'not a contiguous netmask');
    nic.routes.push({ to: `${r.network}/${prefix}`, via: r.gateway });
  });
  if (typeof net.gateway === 'string' && net.gateway !== '') {
    nic.routes.push({ to: isV6(net.gateway) ? '::/0' : '0.0.0.0/0', via: net.gateway });
  }
  const ds = net.dns_nameservers;
  if (Array.isArray(ds)) nic.dnsServers.push(...ds.map(String));
  const dsearch = net.dns_search;
  if (Array.isArray(dsearch)) nic.dnsSearch.push(...dsearch.map(String));
}

function readAddressing(net: Record<string, unknown>, nic: NetInterface, f: string): void {
  switch (net.type) {
    case 'ipv4_dhcp':
      nic.dhcp4 = true;
      break;
    case 'ipv6_dhcp':
    case 'ipv6_dhcpv6-stateful':
      nic.dhcp6 = true;
      nic.slaac = true;
      break;
    case 'ipv6_slaac':
    case 'ipv6_dhcpv6-stateless':
      nic.slaac = true;
      break;
    case 'ipv4':
    case 'static':
    case 'ipv6':
    case 'static6':
      nic.addresses.push(cidrOf(net.ip_address, net.netmask, f));
      break;
    default:
      throw unsupported(`${f}.type`, `network type "${String(net.type)}"`);
  }
}
