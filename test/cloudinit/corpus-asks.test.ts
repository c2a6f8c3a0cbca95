// What the VMI asked for is what the guest gets, as cloud-init's own code
// reports it: each case below lists, read off the case's manifests by hand
// (not from vmseed's output), the hostname, users, keys, files, commands and
// network it asks for. vmseed renders the seed; seed_view.py reads it with
// cloud-init's datasource readers, user-data processor, cloud-config merger,
// user normalization, write_files decoder and network_state, and the asks
// are checked against that view. The golden files of corpus.test.ts only
// detect change; these properties hold whatever vmseed writes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import { runCase } from './corpus-lib.ts';

interface Nic {
  mac: string;
  addresses?: string[];
  dhcp?: string[];
}
interface Asks {
  hostname?: string;
  // user name → keys authorized for that user
  users?: Record<string, string[]>;
  // keys the datasource hands to the default user
  keys?: string[];
  // path → content
  files?: Record<string, string | Buffer>;
  runcmd?: string[];
  network?: Nic[];
}

const ALICE = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGl0ZW1vbmVrZXlvbmVrZXlvbmVrZXlvbmVrZXlvbmU alice@laptop';
const BOB = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGl0ZW10d29rZXl0d29rZXl0d29rZXl0d29rZXl0d28 bob@desk';
const CAROL = 'ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC3dGhyZWV0aHJlZXRocmVldGhyZWV0aHJlZQ== carol@ci';
const DAVE = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZvdXJmb3VyZm91cmZvdXJmb3VyZm91cmZvdXJmb3Vy dave@ops';
const OPS = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOps ops@example';

// init (oVirt-style) plus inline #cloud-config user-data: both reach the guest.
const OV_INIT_FULL: Asks = {
  hostname: 'web1.example.com',
  users: { ops: [ALICE], deploy: [BOB], auditor: [] },
  files: { '/etc/profile.d/site.sh': 'export SITE=paris\n', '/etc/nginx/conf.d/site.conf': 'server { listen 80; }' },
  network: [
    { mac: '52:54:00:12:34:01', addresses: ['192.0.2.10/24', '2001:db8::10/64'] },
    { mac: '52:54:00:12:34:02', dhcp: ['dhcp4', 'dhcp6'] },
  ],
};
const OPS_USER_DATA: Asks = { users: { ops: [OPS] }, runcmd: ['systemctl enable --now nginx'] };

const ASKS: Record<string, Asks> = {
  'ov-init-full-nocloud': OV_INIT_FULL,
  'ov-init-full-configdrive': OV_INIT_FULL,
  'vt-files': {
    files: {
      '/etc/app/app.ini': '[server]\nport = 8080\n',
      '/etc/app/logging.yaml': 'level: info\n',
      '/etc/app/logo.bin': Buffer.from('AAcOFRwjKjE4P0ZNVFtiaXB3foWMk5qhqK+2vcTL0tng5+71/A==', 'base64'),
      '/etc/app/tls.key':
        '-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASCAT8wggE7AgEAAkEA\n-----END PRIVATE KEY-----\n',
      '/opt/app.ini': '[server]\nport = 8080\n',
      '/etc/motd': 'managed by vmseed',
    },
    runcmd: ['systemctl restart app'],
  },
  // sshKeys, sshKeysFrom (comments and blank lines dropped) and KubeVirt's
  // accessCredentials with noCloud propagation: all four keys.
  'vt-ssh-keys': { keys: [ALICE, BOB, CAROL, DAVE] },
  'kv-hostname-from-spec': { hostname: 'web-01' },
  'kv-gzip-userdata': OPS_USER_DATA,
  'kv-nocloud-network-v1-static': {
    ...OPS_USER_DATA,
    network: [{ mac: '52:54:00:12:34:00', addresses: ['192.168.1.10/24', '2001:db8::10/64'] }],
  },
  // network_data.json given to a NoCloud seed: converted, nothing lost.
  'net-nocloud-networkdata-static': {
    network: [
      { mac: 'fa:16:3e:4a:5b:2f', addresses: ['10.0.0.15/24', '2001:db8:0:1::15/64'] },
      { mac: 'fa:16:3e:9f:8e:7d', dhcp: ['dhcp4'] },
    ],
  },
};

type Nics = Array<{ name: string; mac: string | null; addresses: string[]; dhcp: string[] }>;

interface View {
  id: string;
  ok: boolean;
  error?: string;
  hostname?: string;
  users?: Record<string, { sshKeys: string[] }>;
  sshKeys?: string[];
  files?: Record<string, string>;
  runcmd?: string[];
  network?: Nics | { error: string };
}

const SEED_VIEW = fileURLToPath(new URL('./seed_view.py', import.meta.url));
let tmp = '';
const views = new Map<string, View>();

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'vmseed-asks-'));
  const items: Array<{ id: string; dir: string; datasource: string }> = [];
  for (const name of Object.keys(ASKS)) {
    const r = await runCase(name);
    assert.ok('outcome' in r && r.outcome.kind === 'seed', `${name} renders a seed`);
    const dir = join(tmp, name);
    for (const f of serializeMetaData(r.outcome.seed)) {
      mkdirSync(dirname(join(dir, f.path)), { recursive: true });
      writeFileSync(join(dir, f.path), f.bytes);
    }
    items.push({ id: name, dir, datasource: r.outcome.seed.datasource });
  }
  const p = spawnSync('/usr/bin/python3', [SEED_VIEW], { input: JSON.stringify(items), encoding: 'utf8' });
  assert.equal(p.status, 0, p.stderr);
  for (const v of JSON.parse(p.stdout) as View[]) views.set(v.id, v);
});

after(() => rmSync(tmp, { recursive: true, force: true }));

for (const [name, asks] of Object.entries(ASKS)) {
  test(`cloud-init gives the guest what ${name} asks for`, () => {
    const v = views.get(name);
    assert.ok(v?.ok, `${name}: ${v?.error}`);
    if (asks.hostname !== undefined) assert.equal(v.hostname, asks.hostname, 'hostname');
    for (const [user, keys] of Object.entries(asks.users ?? {})) {
      assert.ok(v.users?.[user], `user ${user} is created; cloud-init has ${Object.keys(v.users ?? {}).join(', ')}`);
      assert.deepEqual([...v.users[user].sshKeys].sort(), [...keys].sort(), `keys of ${user}`);
    }
    if (asks.keys) assert.deepEqual([...(v.sshKeys ?? [])].sort(), [...asks.keys].sort(), 'datasource keys');
    for (const [path, content] of Object.entries(asks.files ?? {})) {
      assert.ok(
        v.files?.[path] !== undefined,
        `${path} is written; cloud-init writes ${Object.keys(v.files ?? {}).join(', ')}`,
      );
      assert.deepEqual(Buffer.from(v.files[path], 'base64'), Buffer.from(content), `content of ${path}`);
    }
    for (const cmd of asks.runcmd ?? [])
      assert.ok(v.runcmd?.includes(cmd), `runcmd has ${cmd}: ${v.runcmd?.join('; ')}`);
    for (const nic of asks.network ?? []) {
      assert.ok(Array.isArray(v.network), `network config read: ${JSON.stringify(v.network)}`);
      const got: Nics[number] | undefined = v.network.find((i) => i.mac === nic.mac);
      assert.ok(got, `an interface with MAC ${nic.mac}: ${JSON.stringify(v.network)}`);
      assert.deepEqual([...got.addresses].sort(), [...(nic.addresses ?? [])].sort(), `addresses on ${nic.mac}`);
      assert.deepEqual([...got.dhcp].sort(), [...(nic.dhcp ?? [])].sort(), `DHCP on ${nic.mac}`);
    }
  });
}
