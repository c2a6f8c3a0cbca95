// One in-memory shape for the network setups vmseed converts between
// (oVirt-style `init.nics`, network-config v1/v2, OpenStack
// network_data.json). Only what all of them can say is here; every reader
// refuses, by name, what does not fit, so no conversion silently drops a setting.
export interface NetRoute {
  // CIDR, e.g. "10.0.0.0/8", "0.0.0.0/0", "::/0".
  to: string;
  via: string;
  metric?: number;
}

export interface NetInterface {
  // Stable key: the v2 ethernets id / the network_data.json link id.
  id: string;
  mac?: string;
  // Guest interface name to set (or to match when there is no MAC).
  name?: string;
  mtu?: number;
  dhcp4: boolean;
  dhcp6: boolean;
  // IPv6 router advertisements (SLAAC).
  slaac: boolean;
  // CIDR addresses, IPv4 and IPv6 mixed, in the order given.
  addresses: string[];
  routes: NetRoute[];
  // Per-interface DNS (v2 nameservers, v1 subnet dns_*).
  dnsServers: string[];
  dnsSearch: string[];
}

/** A network setup in the terms every format vmseed converts between can express (header). */
export interface NetModel {
  interfaces: NetInterface[];
  // Global DNS (v1 nameserver entries, network_data.json services).
  dns: { servers: string[]; search: string[] };
}

/** An interface `id` that configures nothing yet (no DHCP, addresses, routes or DNS). */
export function emptyInterface(id: string): NetInterface {
  return { id, dhcp4: false, dhcp6: false, slaac: false, addresses: [], routes: [], dnsServers: [], dnsSearch: [] };
}

/** Whether an address or CIDR is IPv6, by its ":" alone: it does not validate. */
export const isV6 = (addr: string): boolean => addr.includes(':');

export const isDefaultRoute = (to: string): boolean => to === '0.0.0.0/0' || to === '::/0';

const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
/** A MAC address in lower case ("52:54:00:12:34:56"), or undefined when `mac` is not one. */
export function normalizeMac(mac: string): string | undefined {
  const m = mac.trim().toLowerCase();
  return MAC.test(m) ? m : undefined;
}

function parseV6(addr: string): number[] | undefined {
  const parts = addr.split('::');
  if (parts.length > 2) return undefined;
  const words = (s: string) => (s === '' ? [] : s.split(':'));
  const head = words(parts[0]);
  const tail = parts.length === 2 ? words(parts[1]) : [];
  const n = head.length + tail.length;
  if ((parts.length === 1 && n !== 8) || n > 7 + (parts.length === 1 ? 1 : 0)) return undefined;
  const fill = parts.length === 2 ? Array<string>(8 - n).fill('0') : [];
  const all = [...head, ...fill, ...tail];
  if (!all.every((w) => /^[0-9a-fA-F]{1,4}$/.test(w))) return undefined;
  return all.map((w) => parseInt(w, 16));
}

/** Whether `addr` is an IPv4 dotted or IPv6 textual address, without prefix (no zone, no embedded IPv4). */
export function isIp(addr: string): boolean {
  if (/^\d{1,3}(\.\d{1,3}){3}$/.test(addr)) return addr.split('.').every((o) => Number(o) <= 255);
  return isV6(addr) && parseV6(addr) !== undefined;
}

/** An "address/prefix" split up (prefix at most 32 or 128), or undefined when `cidr` is not one. */
export function parseCidr(cidr: string): { ip: string; prefix: number; v6: boolean } | undefined {
  const m = /^([^/]+)\/(\d{1,3})$/.exec(cidr.trim());
  if (!m || !isIp(m[1])) return undefined;
  const v6 = isV6(m[1]);
  const prefix = Number(m[2]);
  if (prefix > (v6 ? 128 : 32)) return undefined;
  return { ip: m[1], prefix, v6 };
}

export function prefixToNetmask(prefix: number, v6: boolean): string {
  if (!v6) {
    const octets: number[] = [];
    for (let i = 0; i < 4; i++) {
      const bits = Math.max(0, Math.min(8, prefix - i * 8));
      octets.push((0xff << (8 - bits)) & 0xff);
    }
    return octets.join('.');
  }
  const words: number[] = [];
  for (let i = 0; i < 8; i++) {
    const bits = Math.max(0, Math.min(16, prefix - i * 16));
    words.push((0xffff << (16 - bits)) & 0xffff);
  }
  // Compressed as Nova and Python's ipaddress print it ("ffff:ffff:ffff:ffff::").
  const firstZero = words.indexOf(0);
  if (firstZero < 0) return words.map((w) => w.toString(16)).join(':');
  return `${words
    .slice(0, firstZero)
    .map((w) => w.toString(16))
    .join(':')}::`;
}

// Contiguous masks only; undefined otherwise.
export function netmaskToPrefix(mask: string): number | undefined {
  let bits: number[];
  if (isV6(mask)) {
    const w = parseV6(mask);
    if (!w) return undefined;
    bits = w.flatMap((x) => [...x.toString(2).padStart(16, '0')].map(Number));
  } else {
    if (!isIp(mask)) return undefined;
    bits = mask.split('.').flatMap((o) => [...Number(o).toString(2).padStart(8, '0')].map(Number));
  }
  const prefix = bits.indexOf(0) < 0 ? bits.length : bits.indexOf(0);
  return bits.slice(prefix).every((b) => b === 0) ? prefix : undefined;
}
