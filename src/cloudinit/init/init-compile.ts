// `init:` (oVirt's structured initialization) → a cloud-config mapping plus a
// NetModel that render.ts writes as network-config v2 (NoCloud) or
// network_data.json (ConfigDrive). User-supplied cloud-config is merged over
// the mapping later (../userdata/compose.ts).
import { VmseedError } from '../../errors.ts';
import { sha512Crypt, isValidSalt } from '../crypt-sha512.ts';
import type { RefResolver } from '../../api/objects.ts';
import { emptyInterface, type NetModel } from '../network/model.ts';
import type { SaltProvider } from './password-salt.ts';
import { fetchObject } from '../refs/object-refs.ts';
import { secretValue } from '../refs/secret-data.ts';
import type { InitSpec } from './init-parse.ts';
import { LIMITS } from '../limits.ts';

/** `init:` compiled: its cloud-config mapping, and the network model when it has `nics`. */
export interface CompiledInit {
  cloudConfig: Record<string, unknown>;
  network?: NetModel;
}

export interface CompileContext {
  namespace: string;
  vmiUid: string;
  refs: RefResolver;
  salt: SaltProvider;
  // Field prefix for messages, e.g. "vmseed.io/cloud-init.init".
  prefix: string;
}

async function hashedPassword(user: InitSpec['users'][number], i: number, ctx: CompileContext): Promise<string> {
  const ref = user.passwordFrom!;
  const field = `${ctx.prefix}.users[${i}].passwordFrom`;
  const secret = await fetchObject(ctx.refs, 'Secret', ctx.namespace, ref.name, field);
  const bytes = secretValue(secret, ref.key);
  if (bytes === undefined) {
    throw new VmseedError(
      'SECRET_KEY_NOT_FOUND',
      `Secret ${ctx.namespace}/${ref.name} referenced by ${field} has no key "${ref.key}"; add the password under it (vmseed retries)`,
      { kind: 'retryable', field },
    );
  }
  // Checked before decoding or hashing: crypt's cost grows with the length.
  if (bytes.length > LIMITS.passwordBytes + 2) {
    throw new VmseedError(
      'INIT_INVALID',
      `${field}: the password in Secret ${ctx.namespace}/${ref.name} is longer than ${LIMITS.passwordBytes} bytes; use a shorter password`,
      { kind: 'terminal', field },
    );
  }
  // `kubectl create secret --from-file` keeps the file's final newline, which
  // nobody types at a login prompt.
  let password = Buffer.from(bytes).toString('utf8');
  if (password.endsWith('\r\n')) password = password.slice(0, -2);
  else if (password.endsWith('\n')) password = password.slice(0, -1);
  if (password === '') {
    throw new VmseedError(
      'INIT_INVALID',
      `${field}: the password in Secret ${ctx.namespace}/${ref.name} is empty; put a password there or remove passwordFrom`,
      { kind: 'terminal', field },
    );
  }
  const salt = ctx.salt({ vmiUid: ctx.vmiUid, user: user.name });
  if (!isValidSalt(salt)) {
    throw new VmseedError(
      'CONFIG_INVALID',
      'the password salt provider returned an invalid salt (1-16 characters of [./0-9A-Za-z])',
      { kind: 'terminal', field },
    );
  }
  return sha512Crypt(password, salt);
}

/**
 * Compiles a checked `init:`; each passwordFrom Secret is read and its password stored as a
 * SHA-512 crypt hash salted by ctx.salt. Throws VmseedError: SECRET_NOT_FOUND, SECRET_KEY_NOT_FOUND
 * (retryable), INIT_INVALID (password empty or too long), CONFIG_INVALID (an invalid salt).
 */
export async function compileInit(spec: InitSpec, ctx: CompileContext): Promise<CompiledInit> {
  const cc: Record<string, unknown> = {};
  if (spec.hostname) cc.hostname = spec.hostname;
  if (spec.fqdn) cc.fqdn = spec.fqdn;
  if (spec.timezone) cc.timezone = spec.timezone;
  if (spec.regenerateSSHHostKeys !== undefined) cc.ssh_deletekeys = spec.regenerateSSHHostKeys;
  if (spec.users.length > 0) {
    // "default" first: the image's default user keeps existing and still
    // receives the meta-data public keys (accessCredentials, sshKeys).
    const users: unknown[] = ['default'];
    for (let i = 0; i < spec.users.length; i++) {
      const u = spec.users[i];
      const entry: Record<string, unknown> = { name: u.name };
      if (u.groups && u.groups.length > 0) entry.groups = [...u.groups];
      if (u.sudo) entry.sudo = u.sudo;
      if (u.shell) entry.shell = u.shell;
      if (u.passwordFrom) {
        entry.lock_passwd = false;
        entry.passwd = await hashedPassword(u, i, ctx);
      }
      if (u.authorizedKeys.length > 0) entry.ssh_authorized_keys = [...u.authorizedKeys];
      users.push(entry);
    }
    cc.users = users;
  }
  if (spec.files.length > 0) {
    cc.write_files = spec.files.map((f) => ({
      path: f.path,
      content: f.content,
      ...(f.permissions ? { permissions: f.permissions } : {}),
      ...(f.owner ? { owner: f.owner } : {}),
    }));
  }
  let network: NetModel | undefined;
  if (spec.nics.length > 0) {
    network = {
      dns: { servers: [...spec.dns.servers], search: [...spec.dns.search] },
      interfaces: spec.nics.map((n, i) => {
        const nic = emptyInterface(n.name ?? `nic${i}`);
        if (n.mac) nic.mac = n.mac;
        if (n.name) nic.name = n.name;
        if (n.mtu !== undefined) nic.mtu = n.mtu;
        nic.dhcp4 = n.dhcp4;
        nic.dhcp6 = n.dhcp6;
        nic.slaac = n.slaac;
        nic.addresses = [...n.addresses];
        if (n.gateway4) nic.routes.push({ to: '0.0.0.0/0', via: n.gateway4 });
        if (n.gateway6) nic.routes.push({ to: '::/0', via: n.gateway6 });
        nic.routes.push(...n.routes);
        return nic;
      }),
    };
  }
  return { cloudConfig: cc, ...(network ? { network } : {}) };
}
