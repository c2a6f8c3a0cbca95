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
const TIMEZONE = /^[A-Za-z0-9_+\-]+(\/[A-Za-z0-9_+\-]+)*$/;

export function parseInit(raw: Record<string, unknown>, prefix: string): InitSpec {
  const bad = (field: string, message: string) =>
    new VmseedError('INIT_INVALID', `${prefix}.${field} ${message}`, { kind: 'terminal', field: `${prefix}.${field}` });
  const known = (obj: Record<string, unknown>, fields: readonly string[], at: string) => {
    for (const k of Object.keys(obj))
      if (!fields.includes(k)) throw bad(`${at}${k}`, `is not a known field; known: ${fields.join(', ')}`);
  };
  const str = (v: unknown, field: string): string | undefined => {
    if (v == null) return undefined;
    if (typeof v !== 'string' || v === '') throw bad(field, 'must be a non-empty string');
    return v;
  };
  const cap = (list: readonly unknown[], max: number, field: string) => {
    if (list.length > max) throw listTooLong(`${prefix}.${field}`, list.length, max);
  };
  const strList = (v: unknown, field: string, max: number): string[] => {
    if (v == null) return [];
    if (!Array.isArray(v)) throw bad(field, 'must be a list of non-empty strings');
    cap(v, max, field);
    if (!v.every((x) => typeof x === 'string' && x !== '')) throw bad(field, 'must be a list of non-empty strings');
    return v as string[];
  };
  const bool = (v: unknown, field: string): boolean => {
    if (v == null) return false;
    if (typeof v !== 'boolean') throw bad(field, 'must be true or false');
    return v;
  };

  known(raw, INIT_FIELDS, '');
  const spec: InitSpec = { users: [], dns: { servers: [], search: [] }, nics: [], files: [] };
  spec.hostname = str(raw.hostname, 'hostname');
  if (spec.hostname && (!HOSTNAME.test(spec.hostname) || spec.hostname.includes('.'))) {
    throw bad('hostname', 'must be one DNS label (letters, digits, "-", at most 63); put the full name in fqdn');
  }
  spec.fqdn = str(raw.fqdn, 'fqdn');
  if (spec.fqdn && (!HOSTNAME.test(spec.fqdn) || !spec.fqdn.includes('.')))
    throw bad('fqdn', 'must be a dotted DNS name like web1.example.com');
  spec.timezone = str(raw.timezone, 'timezone');
  if (spec.timezone && !TIMEZONE.test(spec.timezone))
    throw bad('timezone', 'must be a tz database name like Europe/Paris or UTC');
  if (raw.regenerateSSHHostKeys != null)
    spec.regenerateSSHHostKeys = bool(raw.regenerateSSHHostKeys, 'regenerateSSHHostKeys');

  if (raw.users != null) {
    if (!Array.isArray(raw.users))
      throw bad('users', 'must be a list of users ({name, groups, sudo, shell, passwordFrom, authorizedKeys})');
    cap(raw.users, LIMITS.initUsers, 'users');
    const seen = new Set<string>();
    spec.users = raw.users.map((u, i) => {
      const at = `users[${i}]`;
      if (!isPlainObject(u)) throw bad(at, 'must be a mapping with at least "name"');
      known(u, USER_FIELDS, `${at}.`);
      const name = str(u.name, `${at}.name`);
      if (!name || !USER_NAME.test(name))
        throw bad(
          `${at}.name`,
          'must be a user name (lowercase letters, digits, "_", "-"; starting with a letter or "_")',
        );
      if (seen.has(name)) throw bad(`${at}.name`, `repeats user "${name}"; list each user once`);
      seen.add(name);
      const user: InitUser = {
        name,
        authorizedKeys: strList(u.authorizedKeys, `${at}.authorizedKeys`, LIMITS.sshKeys),
      };
      if (u.groups != null) {
        user.groups =
          typeof u.groups === 'string'
            ? u.groups
                .split(',')
                .map((g) => g.trim())
                .filter(Boolean)
            : strList(u.groups, `${at}.groups`, LIMITS.userGroups);
        cap(user.groups, LIMITS.userGroups, `${at}.groups`);
      }
      if (u.sudo === true) user.sudo = 'ALL=(ALL) NOPASSWD:ALL';
      else if (u.sudo != null && u.sudo !== false) user.sudo = str(u.sudo, `${at}.sudo`);
      user.shell = str(u.shell, `${at}.shell`);
      if (user.shell && !user.shell.startsWith('/'))
        throw bad(`${at}.shell`, 'must be an absolute path like /bin/bash');
      if (u.passwordFrom != null) {
        const p = u.passwordFrom;
        if (!isPlainObject(p) || typeof p.name !== 'string' || p.name === '') {
          throw bad(
            `${at}.passwordFrom`,
            'must be {name: <Secret>, key?: <key, default "password">}; passwords come from Secrets only',
          );
        }
        known(p, ['name', 'key', 'kind'], `${at}.passwordFrom.`);
        if (p.kind != null && String(p.kind).toLowerCase() !== 'secret')
          throw bad(`${at}.passwordFrom.kind`, 'must be "secret": passwords are never read from ConfigMaps');
        user.passwordFrom = { name: p.name, key: str(p.key, `${at}.passwordFrom.key`) ?? 'password' };
      }
      return user;
    });
  }

  if (raw.dns != null) {
    if (!isPlainObject(raw.dns)) throw bad('dns', 'must be {servers: [...], search: [...]}');
    known(raw.dns, ['servers', 'search'], 'dns.');
    spec.dns.servers = strList(raw.dns.servers, 'dns.servers', LIMITS.dnsEntries);
    spec.dns.servers.forEach((s, i) => {
      if (!isIp(s)) throw bad(`dns.servers[${i}]`, 'must be an IPv4 or IPv6 address');
    });
    spec.dns.search = strList(raw.dns.search, 'dns.search', LIMITS.dnsEntries);
  }

  if (raw.nics != null) {
    if (!Array.isArray(raw.nics))
      throw bad(
        'nics',
        'must be a list of NICs ({mac or name, dhcp4, dhcp6, slaac, addresses, gateway4, gateway6, routes})',
      );
    cap(raw.nics, LIMITS.initNics, 'nics');
    spec.nics = raw.nics.map((n, i) => {
      const at = `nics[${i}]`;
      if (!isPlainObject(n)) throw bad(at, 'must be a mapping');
      known(n, NIC_FIELDS, `${at}.`);
      const nic: InitNic = {
        dhcp4: bool(n.dhcp4, `${at}.dhcp4`),
        dhcp6: bool(n.dhcp6, `${at}.dhcp6`),
        slaac: bool(n.slaac, `${at}.slaac`) || bool(n.autoconf, `${at}.autoconf`),
        addresses: strList(n.addresses, `${at}.addresses`, LIMITS.nicRoutes),
        routes: [],
      };
      if (n.mac != null) {
        const mac = normalizeMac(String(n.mac));
        if (!mac) throw bad(`${at}.mac`, 'must be a MAC address like "52:54:00:12:34:56" (quote it in YAML)');
        nic.mac = mac;
      }
      nic.name = str(n.name, `${at}.name`);
      if (nic.name && !/^[A-Za-z0-9_.-]{1,15}$/.test(nic.name))
        throw bad(`${at}.name`, 'must be a Linux interface name (at most 15 letters, digits, "_", ".", "-")');
      if (!nic.mac && !nic.name) throw bad(at, 'needs "mac" or "name" to find the guest NIC');
      nic.addresses.forEach((a, j) => {
        if (!parseCidr(a))
          throw bad(`${at}.addresses[${j}]`, 'must be an address with prefix, like 192.0.2.10/24 or 2001:db8::10/64');
      });
      for (const [key, v6] of [
        ['gateway4', false],
        ['gateway6', true],
      ] as const) {
        const g = str(n[key], `${at}.${key}`);
        if (g === undefined) continue;
        if (!isIp(g) || isV6(g) !== v6) throw bad(`${at}.${key}`, `must be an IPv${v6 ? 6 : 4} address`);
        if (!nic.addresses.some((a) => isV6(a) === v6))
          throw bad(`${at}.${key}`, `needs a static IPv${v6 ? 6 : 4} address in addresses`);
        nic[key] = g;
      }
      if (n.routes != null) {
        if (!Array.isArray(n.routes)) throw bad(`${at}.routes`, 'must be a list of {to: <CIDR>, via: <IP>, metric?}');
        cap(n.routes, LIMITS.nicRoutes, `${at}.routes`);
        nic.routes = n.routes.map((r, j) => {
          const rf = `${at}.routes[${j}]`;
          if (!isPlainObject(r)) throw bad(rf, 'must be {to: <CIDR>, via: <IP>, metric?}');
          known(r, ['to', 'via', 'metric'], `${rf}.`);
          const to = str(r.to, `${rf}.to`);
          const via = str(r.via, `${rf}.via`);
          if (!to || !parseCidr(to)) throw bad(`${rf}.to`, 'must be a destination in CIDR form like 10.0.0.0/8');
          if (!via || !isIp(via)) throw bad(`${rf}.via`, 'must be a gateway IP address');
          if (isV6(via) !== parseCidr(to)!.v6)
            throw bad(
              `${rf}.via`,
              `must be an IPv${isV6(to) ? 6 : 4} gateway for an IPv${isV6(to) ? 6 : 4} destination`,
            );
          if (r.metric != null && (typeof r.metric !== 'number' || !Number.isInteger(r.metric) || r.metric < 0))
            throw bad(`${rf}.metric`, 'must be a non-negative integer');
          return { to, via, ...(typeof r.metric === 'number' ? { metric: r.metric } : {}) };
        });
      }
      if (n.mtu != null) {
        if (typeof n.mtu !== 'number' || !Number.isInteger(n.mtu) || n.mtu < 576 || n.mtu > 65535)
          throw bad(`${at}.mtu`, 'must be an integer between 576 and 65535');
        nic.mtu = n.mtu;
      }
      if (!nic.dhcp4 && !nic.dhcp6 && !nic.slaac && nic.addresses.length === 0) {
        throw bad(at, 'configures nothing; set dhcp4, dhcp6, slaac or addresses');
      }
      return nic;
    });
  }
  const names = new Set<string>();
  const macs = new Set<string>();
  spec.nics.forEach((n, i) => {
    if (n.name && names.has(n.name)) throw bad(`nics[${i}].name`, `repeats NIC name "${n.name}"; each NIC once`);
    if (n.mac && macs.has(n.mac)) throw bad(`nics[${i}].mac`, `repeats MAC ${n.mac}; each NIC once`);
    if (n.name) names.add(n.name);
    if (n.mac) macs.add(n.mac);
  });
  if ((spec.dns.servers.length > 0 || spec.dns.search.length > 0) && spec.nics.length === 0) {
    throw bad('dns', 'needs at least one entry in nics (DNS is part of the network config)');
  }

  if (raw.files != null) {
    if (!Array.isArray(raw.files)) throw bad('files', 'must be a list of {path, content, permissions?, owner?}');
    cap(raw.files, LIMITS.initFiles, 'files');
    spec.files = raw.files.map((f, i) => {
      const at = `files[${i}]`;
      if (!isPlainObject(f)) throw bad(at, 'must be {path, content, permissions?, owner?}');
      known(f, FILE_FIELDS, `${at}.`);
      const path = str(f.path, `${at}.path`);
      if (!path || !path.startsWith('/')) throw bad(`${at}.path`, 'must be an absolute path in the guest');
      if (typeof f.content !== 'string') throw bad(`${at}.content`, 'must be a string (use a YAML block scalar "|")');
      const file: InitFile = { path, content: f.content };
      if (f.permissions != null) {
        const p = permissionsText(f.permissions);
        if (p === undefined) throw bad(`${at}.permissions`, 'must be octal permissions like "0644" (quote it)');
        file.permissions = p;
      }
      file.owner = str(f.owner, `${at}.owner`);
      return file;
    });
  }
  return spec;
}
