// NetModel → OpenStack network_data.json, as Nova writes it (links,
// networks, services; default gateways as routes to 0.0.0.0/0.0.0.0 and
// ::/::) and as cloud-init's convert_net_json reads it. What it cannot say
// is refused by name (NETWORK_CONVERSION_UNSUPPORTED) instead of dropped.
import { VmseedError } from '../../errors.ts';
import { type NetInterface, type NetModel, parseCidr, prefixToNetmask } from './model.ts';

function unsupported(field: string, what: string): VmseedError {
  return new VmseedError(
    'NETWORK_CONVERSION_UNSUPPORTED',
    `${field}: ${what} cannot be expressed in OpenStack network_data.json, which ConfigDrive needs; ` +
      'remove it or use datasource nocloud',
    { kind: 'terminal', field },
  );
}

function routeEntry(to: string, via: string, field: string): Record<string, unknown> {
  const c = parseCidr(to);
  if (!c) throw unsupported(field, `route destination "${to}" (not a CIDR)`);
  return { network: c.ip, netmask: prefixToNetmask(c.prefix, c.v6), gateway: via };
}

// `field(i)` names the input item interface i came from, for errors.
export function modelToNetworkData(
  model: NetModel,
  field: (i: number) => string,
  dnsField = 'dns.search',
): Record<string, unknown> {
  const links: Record<string, unknown>[] = [];
  const networks: Record<string, unknown>[] = [];
  model.interfaces.forEach((nic, i) => {
    const at = field(i);
    if (nic.routes.some((r) => r.metric !== undefined)) throw unsupported(`${at}.routes`, 'a route metric');
    if (!nic.mac && !nic.name) throw unsupported(at, 'an interface matched by neither MAC nor name');
    links.push({
      id: nic.id,
      type: 'phy',
      ...(nic.mac ? { ethernet_mac_address: nic.mac } : {}),
      ...(nic.mtu !== undefined ? { mtu: nic.mtu } : {}),
      // Not in Nova's schema, but cloud-init names the guest NIC after it.
      ...(nic.name ? { name: nic.name } : {}),
    });
    addNetworks(nic, at, networks);
    if (nic.dnsServers.length > 0 || nic.dnsSearch.length > 0) {
      throw unsupported(
        at,
        'per-interface DNS (network_data.json has only global dns services); use global nameservers',
      );
    }
  });
  return { links, networks, services: dnsServices(model, dnsField) };
}

// One interface's networks, numbered on from those already listed.
function addNetworks(nic: NetInterface, at: string, networks: Record<string, unknown>[]): void {
  const net = (type: string, extra: Record<string, unknown> = {}) => {
    const id = `network${networks.length}`;
    networks.push({ id, link: nic.id, network_id: id, type, ...extra });
  };
  if (nic.dhcp4) net('ipv4_dhcp');
  if (nic.dhcp6) net('ipv6_dhcpv6-stateful');
  if (nic.slaac && !nic.dhcp6) net('ipv6_slaac');
  // Routes belong to the network of their family; the first static
  // network of a family carries them (cloud-init merges all of a link's).
  const routesFor = (v6: boolean) => nic.routes.filter((r) => r.via.includes(':') === v6);
  const used = { v4: false, v6: false };
  for (const addr of nic.addresses) {
    const c = parseCidr(addr)!;
    const fam = c.v6 ? 'v6' : 'v4';
    const routes = used[fam] ? [] : routesFor(c.v6).map((r) => routeEntry(r.to, r.via, `${at}.routes`));
    used[fam] = true;
    net(c.v6 ? 'ipv6' : 'ipv4', {
      ip_address: c.ip,
      netmask: prefixToNetmask(c.prefix, c.v6),
      ...(routes.length ? { routes } : {}),
    });
  }
  for (const v6 of [false, true]) {
    if (!used[v6 ? 'v6' : 'v4'] && routesFor(v6).length > 0) {
      throw unsupported(
        `${at}.routes`,
        `an IPv${v6 ? 6 : 4} route on an interface without a static IPv${v6 ? 6 : 4} address`,
      );
    }
  }
}

function dnsServices(model: NetModel, dnsField: string): Record<string, unknown>[] {
  const services: Record<string, unknown>[] = model.dns.servers.map((address) => ({ type: 'dns', address }));
  if (model.dns.search.length > 0) {
    // Nova's schema has no search domains. cloud-init turns each service into
    // a v1 nameserver entry and keeps its "search", so they ride on the first
    // dns service. (A network's dns_search would be read too, but then
    // cloud-init 22.4's netplan renderer drops the global servers for that
    // interface.)
    if (services.length === 0) throw unsupported(dnsField, 'DNS search domains without DNS servers');
    services[0].search = [...model.dns.search];
  }
  return services;
}

export function networkDataBytes(doc: Record<string, unknown>): Uint8Array {
  return new Uint8Array(Buffer.from(JSON.stringify(doc), 'utf8'));
}
