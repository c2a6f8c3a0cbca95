// The oVirt-style `init:` section of the vmseed annotation, checked into a
// typed shape. Every error is INIT_INVALID with the field path and what to
// write instead.
import { VmseedError } from '../../errors.ts';
import { isIp, isV6, normalizeMac, parseCidr } from '../network/model.ts';
import { isPlainObject } from '../yaml.ts';
import { permissionsText } from '../annotation/extras.ts';
import { LIMITS, listTooLong } from '../limits.ts';

export interface InitUser {
  name: string;
  groups?: string[];
  sudo?: string;
  shell?: string;
  passwordFrom?: { name: string; key: string };
  authorizedKeys: string[];
}

export interface InitNic {
  mac?: string;
  name?: string;
  dhcp4: boolean;
  dhcp6: boolean;
  slaac: boolean;
  addresses: string[];
  gateway4?: string;
  gateway6?: string;
  routes: Array<{ to: string; via: string; metric?: number }>;
  mtu?: number;
}

export interface InitFile {
  path: string;
  content: string;
  permissions?: string;
  owner?: string;
}

export interface InitSpec {
  hostname?: string;
  fqdn?: string;
  timezone?: string;
  regenerateSSHHostKeys?: boolean;
  users: InitUser[];
  dns: { servers: string[]; search: string[] };
  nics: InitNic[];
  files: InitFile[];
}

export const INIT_FIELDS = [
  'hostname',
  'fqdn',
  'timezone',
  'regenerateSSHHostKeys',
  'users',
  'dns',
  'nics',
  'files',
] as const;
export const USER_FIELDS = ['name', 'groups', 'sudo', 'shell', 'passwordFrom', 'authorizedKeys'];
export const NIC_FIELDS = [
  'mac',
  'name',
  'dhcp4',
  'dhcp6',
  'slaac',
  'autoconf',
  'addresses',
  'gateway4',
  'gateway6',
  'routes',
  'mtu',
];
export const FILE_FIELDS = ['path', 'content', 'permissions', 'owner'];

// useradd's portable user names (shadow-utils, without the trailing "$").
const USER_NAME = /^[a-z_][a-z0-9_-]{0,31}$/;
const HOSTNAME =
  /^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;
const TIMEZONE = /^[A-Za-z0-9_+-]+(\/[A-Za-z0-9_+-]+)*$/;

/**
 * Checks a raw `init:` mapping into an InitSpec. Pure; throws terminal VmseedError INIT_INVALID
 * (or LIST_TOO_LONG) naming the field under `prefix`.
 */
export function parseInit(raw: Record<string, unknown>, prefix: string): InitSpec {
  const c = checks(prefix);
  c.known(raw, INIT_FIELDS, '');
  const spec: InitSpec = { users: [], dns: { servers: [], search: [] }, nics: [], files: [] };
  parseNames(raw, spec, c);
  if (raw.users != null) spec.users = parseUsers(raw.users, c);
  if (raw.dns != null) spec.dns = parseDns(raw.dns, c);
  if (raw.nics != null) spec.nics = parseNics(raw.nics, c);
  checkNicsUnique(spec.nics, c);
  if ((spec.dns.servers.length > 0 || spec.dns.search.length > 0) && spec.nics.length === 0) {
    throw c.bad('dns', 'needs at least one entry in nics (DNS is part of the network config)');
  }
  if (raw.files != null) spec.files = parseFiles(raw.files, c);
  return spec;
}

// The checks every field of one `init:` section goes through; errors name
// the field under the section's prefix.
interface Checks {
  bad(field: string, message: string): VmseedError;
  known(obj: Record<string, unknown>, fields: readonly string[], at: string): void;
  str(v: unknown, field: string): string | undefined;
  cap(list: readonly unknown[], max: number, field: string): void;
  strList(v: unknown, field: string, max: number): string[];
  bool(v: unknown, field: string): boolean;
}

function checks(prefix: string): Checks {
  const bad = (field: string, message: string) =>
    new VmseedError('INIT_INVALID', `${prefix}.${field} ${message}`, { kind: 'terminal', field: `${prefix}.${field}` });
  const cap = (list: readonly unknown[], max: number, field: string) => {
    if (list.length > max) throw listTooLong(`${prefix}.${field}`, list.length, max);
  };
  return {
    bad,
    cap,
    known: (obj, fields, at) => {
      for (const k of Object.keys(obj))
        if (!fields.includes(k)) throw bad(`${at}${k}`, `is not a known field; known: ${fields.join(', ')}`);
    },
    str: (v, field) => {
      if (v == null) return undefined;
      if (typeof v !== 'string' || v === '') throw bad(field, 'must be a non-empty string');
      return v;
    },
    strList: (v, field, max) => {
      if (v == null) return [];
      if (!Array.isArray(v)) throw bad(field, 'must be a list of non-empty strings');
      cap(v, max, field);
      if (!v.every((x) => typeof x === 'string' && x !== '')) throw bad(field, 'must be a list of non-empty strings');
      return v as string[];
    },
    bool: (v, field) => {
      if (v == null) return false;
      if (typeof v !== 'boolean') throw bad(field, 'must be true or false');
      return v;
    },
  };
}

// hostname, fqdn, timezone, regenerateSSHHostKeys.
function parseNames(raw: Record<string, unknown>, spec: InitSpec, c: Checks): void {
  spec.hostname = c.str(raw.hostname, 'hostname');
  if (spec.hostname && (!HOSTNAME.test(spec.hostname) || spec.hostname.includes('.'))) {
    throw c.bad('hostname', 'must be one DNS label (letters, digits, "-", at most 63); put the full name in fqdn');
  }
  spec.fqdn = c.str(raw.fqdn, 'fqdn');
  if (spec.fqdn && (!HOSTNAME.test(spec.fqdn) || !spec.fqdn.includes('.')))
    throw c.bad('fqdn', 'must be a dotted DNS name like web1.example.com');
  spec.timezone = c.str(raw.timezone, 'timezone');
  if (spec.timezone && !TIMEZONE.test(spec.timezone))
    throw c.bad('timezone', 'must be a tz database name like Europe/Paris or UTC');
  if (raw.regenerateSSHHostKeys != null)
    spec.regenerateSSHHostKeys = c.bool(raw.regenerateSSHHostKeys, 'regenerateSSHHostKeys');
}

function parseUsers(users: unknown, c: Checks): InitUser[] {
  if (!Array.isArray(users))
    throw c.bad('users', 'must be a list of users ({name, groups, sudo, shell, passwordFrom, authorizedKeys})');
  c.cap(users, LIMITS.initUsers, 'users');
  const seen = new Set<string>();
  return users.map((u, i) => parseUser(u, `users[${i}]`, seen, c));
}

function parseUser(u: unknown, at: string, seen: Set<string>, c: Checks): InitUser {
  if (!isPlainObject(u)) throw c.bad(at, 'must be a mapping with at least "name"');
  c.known(u, USER_FIELDS, `${at}.`);
  const name = c.str(u.name, `${at}.name`);
  if (!name || !USER_NAME.test(name))
    throw c.bad(
      `${at}.name`,
      'must be a user name (lowercase letters, digits, "_", "-"; starting with a letter or "_")',
    );
  if (seen.has(name)) throw c.bad(`${at}.name`, `repeats user "${name}"; list each user once`);
  seen.add(name);
  const user: InitUser = { name, authorizedKeys: c.strList(u.authorizedKeys, `${at}.authorizedKeys`, LIMITS.sshKeys) };
  if (u.groups != null) {
    user.groups =
      typeof u.groups === 'string'
        ? u.groups
            .split(',')
            .map((g) => g.trim())
            .filter(Boolean)
        : c.strList(u.groups, `${at}.groups`, LIMITS.userGroups);
    c.cap(user.groups, LIMITS.userGroups, `${at}.groups`);
  }
  if (u.sudo === true) user.sudo = 'ALL=(ALL) NOPASSWD:ALL';
  else if (u.sudo != null && u.sudo !== false) user.sudo = c.str(u.sudo, `${at}.sudo`);
  user.shell = c.str(u.shell, `${at}.shell`);
  if (user.shell && !user.shell.startsWith('/')) throw c.bad(`${at}.shell`, 'must be an absolute path like /bin/bash');
  if (u.passwordFrom != null) user.passwordFrom = parsePasswordFrom(u.passwordFrom, `${at}.passwordFrom`, c);
  return user;
}

function parsePasswordFrom(p: unknown, at: string, c: Checks): { name: string; key: string } {
  if (!isPlainObject(p) || typeof p.name !== 'string' || p.name === '') {
    throw c.bad(at, 'must be {name: <Secret>, key?: <key, default "password">}; passwords come from Secrets only');
  }
  c.known(p, ['name', 'key', 'kind'], `${at}.`);
  // Any YAML value, compared by its text as written.
  if (p.kind != null && String(p.kind).toLowerCase() !== 'secret')
    throw c.bad(`${at}.kind`, 'must be "secret": passwords are never read from ConfigMaps');
  return { name: p.name, key: c.str(p.key, `${at}.key`) ?? 'password' };
}

function parseDns(dns: unknown, c: Checks): InitSpec['dns'] {
  if (!isPlainObject(dns)) throw c.bad('dns', 'must be {servers: [...], search: [...]}');
  c.known(dns, ['servers', 'search'], 'dns.');
  const servers = c.strList(dns.servers, 'dns.servers', LIMITS.dnsEntries);
  servers.forEach((s, i) => {
    if (!isIp(s)) throw c.bad(`dns.servers[${i}]`, 'must be an IPv4 or IPv6 address');
  });
  return { servers, search: c.strList(dns.search, 'dns.search', LIMITS.dnsEntries) };
}

function parseNics(nics: unknown, c: Checks): InitNic[] {
  if (!Array.isArray(nics))
    throw c.bad(
      'nics',
      'must be a list of NICs ({mac or name, dhcp4, dhcp6, slaac, addresses, gateway4, gateway6, routes})',
    );
  c.cap(nics, LIMITS.initNics, 'nics');
  return nics.map((n, i) => parseNic(n, `nics[${i}]`, c));
}

function parseNic(n: unknown, at: string, c: Checks): InitNic {
  if (!isPlainObject(n)) throw c.bad(at, 'must be a mapping');
  c.known(n, NIC_FIELDS, `${at}.`);
  const nic: InitNic = {
    dhcp4: c.bool(n.dhcp4, `${at}.dhcp4`),
    dhcp6: c.bool(n.dhcp6, `${at}.dhcp6`),
    slaac: c.bool(n.slaac, `${at}.slaac`) || c.bool(n.autoconf, `${at}.autoconf`),
    addresses: c.strList(n.addresses, `${at}.addresses`, LIMITS.nicRoutes),
    routes: [],
  };
  if (n.mac != null) {
    // Any YAML value, read by its text as written (an unquoted MAC can be a number).
    const mac = normalizeMac(String(n.mac));
    if (!mac) throw c.bad(`${at}.mac`, 'must be a MAC address like "52:54:00:12:34:56" (quote it in YAML)');
    nic.mac = mac;
  }
  nic.name = c.str(n.name, `${at}.name`);
  if (nic.name && !/^[A-Za-z0-9_.-]{1,15}$/.test(nic.name))
    throw c.bad(`${at}.name`, 'must be a Linux interface name (at most 15 letters, digits, "_", ".", "-")');
  if (!nic.mac && !nic.name) throw c.bad(at, 'needs "mac" or "name" to find the guest NIC');
  nic.addresses.forEach((a, j) => {
    if (!parseCidr(a))
      throw c.bad(`${at}.addresses[${j}]`, 'must be an address with prefix, like 192.0.2.10/24 or 2001:db8::10/64');
  });
  parseGateways(n, nic, at, c);
  if (n.routes != null) nic.routes = parseRoutes(n.routes, `${at}.routes`, c);
  if (n.mtu != null) {
    if (typeof n.mtu !== 'number' || !Number.isInteger(n.mtu) || n.mtu < 576 || n.mtu > 65535)
      throw c.bad(`${at}.mtu`, 'must be an integer between 576 and 65535');
    nic.mtu = n.mtu;
  }
  if (!nic.dhcp4 && !nic.dhcp6 && !nic.slaac && nic.addresses.length === 0) {
    throw c.bad(at, 'configures nothing; set dhcp4, dhcp6, slaac or addresses');
  }
  return nic;
}

function parseGateways(n: Record<string, unknown>, nic: InitNic, at: string, c: Checks): void {
  for (const [key, v6] of [
    ['gateway4', false],
    ['gateway6', true],
  ] as const) {
    const g = c.str(n[key], `${at}.${key}`);
    if (g === undefined) continue;
    if (!isIp(g) || isV6(g) !== v6) throw c.bad(`${at}.${key}`, `must be an IPv${v6 ? 6 : 4} address`);
    if (!nic.addresses.some((a) => isV6(a) === v6))
      throw c.bad(`${at}.${key}`, `needs a static IPv${v6 ? 6 : 4} address in addresses`);
    nic[key] = g;
  }
}

function parseRoutes(routes: unknown, at: string, c: Checks): InitNic['routes'] {
  if (!Array.isArray(routes)) throw c.bad(at, 'must be a list of {to: <CIDR>, via: <IP>, metric?}');
  c.cap(routes, LIMITS.nicRoutes, at);
  return routes.map((r, j) => {
    const rf = `${at}[${j}]`;
    if (!isPlainObject(r)) throw c.bad(rf, 'must be {to: <CIDR>, via: <IP>, metric?}');
    c.known(r, ['to', 'via', 'metric'], `${rf}.`);
    const to = c.str(r.to, `${rf}.to`);
    const via = c.str(r.via, `${rf}.via`);
    if (!to || !parseCidr(to)) throw c.bad(`${rf}.to`, 'must be a destination in CIDR form like 10.0.0.0/8');
    if (!via || !isIp(via)) throw c.bad(`${rf}.via`, 'must be a gateway IP address');
    if (isV6(via) !== parseCidr(to)!.v6)
      throw c.bad(`${rf}.via`, `must be an IPv${isV6(to) ? 6 : 4} gateway for an IPv${isV6(to) ? 6 : 4} destination`);
    if (r.metric != null && (typeof r.metric !== 'number' || !Number.isInteger(r.metric) || r.metric < 0))
      throw c.bad(`${rf}.metric`, 'must be a non-negative integer');
    return { to, via, ...(typeof r.metric === 'number' ? { metric: r.metric } : {}) };
  });
}

function checkNicsUnique(nics: InitNic[], c: Checks): void {
  const names = new Set<string>();
  const macs = new Set<string>();
  nics.forEach((n, i) => {
    if (n.name && names.has(n.name)) throw c.bad(`nics[${i}].name`, `repeats NIC name "${n.name}"; each NIC once`);
    if (n.mac && macs.has(n.mac)) throw c.bad(`nics[${i}].mac`, `repeats MAC ${n.mac}; each NIC once`);
    if (n.name) names.add(n.name);
    if (n.mac) macs.add(n.mac);
  });
}

function parseFiles(files: unknown, c: Checks): InitFile[] {
  if (!Array.isArray(files)) throw c.bad('files', 'must be a list of {path, content, permissions?, owner?}');
  c.cap(files, LIMITS.initFiles, 'files');
  return files.map((f, i) => {
    const at = `files[${i}]`;
    if (!isPlainObject(f)) throw c.bad(at, 'must be {path, content, permissions?, owner?}');
    c.known(f, FILE_FIELDS, `${at}.`);
    const path = c.str(f.path, `${at}.path`);
    if (!path || !path.startsWith('/')) throw c.bad(`${at}.path`, 'must be an absolute path in the guest');
    if (typeof f.content !== 'string') throw c.bad(`${at}.content`, 'must be a string (use a YAML block scalar "|")');
    const file: InitFile = { path, content: f.content };
    if (f.permissions != null) {
      const p = permissionsText(f.permissions);
      if (p === undefined) throw c.bad(`${at}.permissions`, 'must be octal permissions like "0644" (quote it)');
      file.permissions = p;
    }
    file.owner = c.str(f.owner, `${at}.owner`);
    return file;
  });
}
