// NetModel → cloud-init network-config version 2 (bare `version: 2`, which
// cloud-init before 22.2 also reads). Interfaces with a MAC are matched by it
// (and renamed only when a name is given); the others are keyed by name.
// Default routes are written as gateway4/gateway6 (deprecated by netplan, but
// read right by every cloud-init): cloud-init 22.4 (Debian 12) turns a v2
// route `to: ::/0` into ::/64 when it renders ENI or sysconfig (its route
// normalisation runs twice and drops the falsy prefix 0), and fails on
// `to: default`. Seen through the corpus oracle. Only when the family has no
// static address (cloud-init ties gatewayN to one) is a default route kept
// as a route.
import { dumpYaml } from '../yaml.ts';
import { isDefaultRoute, isV6, type NetModel, type NetRoute } from './model.ts';

// A v2 ethernets id is also the interface name cloud-init gives a MAC-matched
// NIC without set-name on ENI/sysconfig distros (netplan keeps the kernel
// name), so it must be a valid Linux interface name: OpenStack link ids such
// as "tap4a5b2f3c-1d2e-…" are replaced by nic<N>.
export const IFNAME = /^[A-Za-z0-9_.-]{1,15}$/;

export function modelToV2(model: NetModel): Record<string, unknown> {
  const ethernets: Record<string, unknown> = {};
  for (const [index, nic] of model.interfaces.entries()) {
    const e: Record<string, unknown> = {};
    if (nic.mac) {
      e.match = { macaddress: nic.mac };
      if (nic.name) e['set-name'] = nic.name;
    }
    if (nic.mtu !== undefined) e.mtu = nic.mtu;
    if (nic.dhcp4) e.dhcp4 = true;
    if (nic.dhcp6) e.dhcp6 = true;
    if (nic.slaac) e['accept-ra'] = true;
    if (nic.addresses.length > 0) e.addresses = [...nic.addresses];
    const routes: NetRoute[] = [];
    for (const r of nic.routes) {
      const v6 = isV6(r.via);
      const key = v6 ? 'gateway6' : 'gateway4';
      const hasStatic = nic.addresses.some((a) => isV6(a) === v6);
      if (isDefaultRoute(r.to) && r.metric === undefined && hasStatic && e[key] === undefined) e[key] = r.via;
      else routes.push(r);
    }
    if (routes.length > 0) {
      e.routes = routes.map((r) => ({ to: r.to, via: r.via, ...(r.metric !== undefined ? { metric: r.metric } : {}) }));
    }
    const servers = [...nic.dnsServers];
    const search = [...nic.dnsSearch];
    if (servers.length > 0 || search.length > 0) {
      e.nameservers = {
        ...(servers.length > 0 ? { addresses: servers } : {}),
        ...(search.length > 0 ? { search } : {}),
      };
    }
    let key = nic.name && !nic.mac ? nic.name : nic.id;
    if (nic.mac && (!IFNAME.test(key) || Object.hasOwn(ethernets, key))) key = `nic${index}`;
    ethernets[key] = e;
  }
  return { version: 2, ethernets };
}

export function modelToV2Bytes(model: NetModel): Uint8Array {
  return new Uint8Array(Buffer.from(dumpYaml(modelToV2(model)), 'utf8'));
}

// v2 has no global DNS: global servers and search domains go on every
// interface, which is what netplan and cloud-init's renderers make of them.
export function withGlobalDnsOnInterfaces(model: NetModel): NetModel {
  const { servers, search } = model.dns;
  if (servers.length === 0 && search.length === 0) return model;
  const uniq = (xs: string[]) => [...new Set(xs)];
  return {
    dns: { servers: [], search: [] },
    interfaces: model.interfaces.map((n) => ({
      ...n,
      dnsServers: uniq([...n.dnsServers, ...servers]),
      dnsSearch: uniq([...n.dnsSearch, ...search]),
    })),
  };
}
