// cloud-init as the oracle for the data vmseed generates beyond KubeVirt:
// - every network-config v2 and network_data.json vmseed writes goes through
//   cloud-init's own parser and its ENI and netplan renderers, and the result
//   holds the addresses, gateways, routes and DNS servers `init.nics` asked for;
// - every conversion (v1/v2 → network_data.json for ConfigDrive,
//   network_data.json → v2 for NoCloud) means to cloud-init what the input
//   meant: both sides parse to the same network state;
// - every SHA-512 crypt hash in the corpus verifies with Python's crypt and
//   with `openssl passwd -6` for the same salt, and no clear password is in
//   any seed file.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { load } from 'js-yaml';
import { ANNOTATION } from '../../src/cloudinit/annotation/annotation.ts';
import { parseYaml } from '../../src/cloudinit/yaml.ts';
import { mergeManifests, parseManifests } from '../../src/agent/local/manifests.ts';
import type { Seed } from '../../src/cloudinit/seed.ts';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import { secretValue } from '../../src/cloudinit/refs/secret-data.ts';
import { NETWORKDATA_SECRET_KEYS } from '../../src/cloudinit/refs/secret-refs.ts';
import { meaning } from './network-meaning.ts';
import {
  CORPUS_DIR,
  caseNames,
  runCase,
  runOracle,
  type NetworkStateSummary,
  type OracleRequest,
  type OracleResponse,
} from './corpus-lib.ts';

interface CaseInfo {
  name: string;
  seed: Seed;
  annotation: Record<string, unknown>;
  objects: ReturnType<typeof mergeManifests>;
}

const cases: CaseInfo[] = [];
const req: Required<OracleRequest> = {
  cloudConfigs: [],
  mimes: [],
  networkConfigs: [],
  noCloudDirs: [],
  configDrives: [],
  networkRenders: [],
  passwords: [],
};
let res: OracleResponse;
const clearPasswords = new Map<string, string[]>();

function loadObjects(name: string) {
  const dir = join(CORPUS_DIR, name);
  return mergeManifests(
    readdirSync(dir)
      .filter((f) => f.endsWith('.yaml'))
      .sort()
      .map((f) => parseManifests(readFileSync(join(dir, f), 'utf8'), f)),
  );
}

const text = (b: Uint8Array) => Buffer.from(b).toString('utf8');

before(async () => {
  for (const name of caseNames()) {
    const r = await runCase(name);
    if (!('outcome' in r) || r.outcome.kind !== 'seed') continue;
    const objects = loadObjects(name);
    const raw = objects.vmis[0].metadata.annotations?.[ANNOTATION];
    const annotation = (raw ? load(raw) : {}) as Record<string, unknown>;
    const info: CaseInfo = { name, seed: r.outcome.seed, annotation, objects };
    cases.push(info);
    const seed = info.seed;
    // Network data written as given with a warning is not vmseed's output;
    // corpus-oracle.test.ts checks what cloud-init makes of it.
    const passedThrough = seed.warnings.some(
      (w) => w.code === 'NETWORKDATA_UNPARSED' || w.code === 'NETWORK_CONVERSION_UNSUPPORTED',
    );
    if (seed.networkConfig && !passedThrough) {
      req.networkRenders.push({
        id: `out:${name}`,
        format: seed.datasource === 'nocloud' ? 'yaml' : 'network_data',
        text: text(seed.networkConfig),
      });
    }
    // The network data the user gave, when vmseed converted it.
    const volume = (objects.vmis[0].spec.volumes ?? []).find((v) => v.cloudInitNoCloud || v.cloudInitConfigDrive);
    const given = annotation.networkData ?? (volume?.cloudInitNoCloud ?? volume?.cloudInitConfigDrive)?.networkData;
    if (typeof given === 'string' && seed.networkConfig && text(seed.networkConfig) !== given) {
      const isJson = given.trimStart().startsWith('{');
      req.networkRenders.push({ id: `in:${name}`, format: isJson ? 'network_data' : 'yaml', text: given });
    }
    if (!given && annotation.networkDataSecretRef && seed.networkConfig) {
      const ref = annotation.networkDataSecretRef as { name: string };
      const secret = objects.secrets.find((s) => s.metadata.name === ref.name)!;
      const key = NETWORKDATA_SECRET_KEYS.find((k) => secretValue(secret, k) !== undefined)!;
      const g = text(secretValue(secret, key)!);
      if (g !== text(seed.networkConfig))
        req.networkRenders.push({ id: `in:${name}`, format: 'network_data', text: g });
    }
    // Passwords asked for through init.users[].passwordFrom, with the hash the seed holds.
    const users = ((annotation.init as Record<string, unknown> | undefined)?.users ?? []) as Array<
      Record<string, unknown>
    >;
    const parsed = parseYaml(text(seed.userData));
    const ud = (parsed.ok ? parsed.value : null) as { users?: Array<Record<string, unknown> | string> } | null;
    const seedUsers = (ud?.users ?? []).filter((u): u is Record<string, unknown> => typeof u === 'object');
    for (const u of users) {
      const from = u.passwordFrom as { name: string; key?: string } | undefined;
      if (!from) continue;
      const secret = objects.secrets.find((s) => s.metadata.name === from.name)!;
      const password = text(secretValue(secret, from.key ?? 'password')!).replace(/\r?\n$/, '');
      const hash = String(seedUsers.find((s) => s.name === u.name)?.passwd);
      req.passwords.push({ id: `${name}:${String(u.name)}`, password, hash });
      clearPasswords.set(name, [...(clearPasswords.get(name) ?? []), password]);
    }
  }
  res = runOracle(req);
});

const render = (id: string) => res.networkRenders.find((r) => r.id === id);

test('the corpus exercises the new features enough', () => {
  const outs = req.networkRenders.filter((r) => r.id.startsWith('out:'));
  assert.ok(outs.filter((r) => r.format === 'yaml').length >= 5, 'network-config v2 outputs');
  assert.ok(outs.filter((r) => r.format === 'network_data').length >= 5, 'network_data.json outputs');
  assert.ok(req.networkRenders.filter((r) => r.id.startsWith('in:')).length >= 5, 'conversions');
  assert.ok(req.passwords.length >= 4, 'password hashes');
});

test('every generated network-config v2 and network_data.json renders through cloud-init (ENI and netplan)', () => {
  for (const r of res.networkRenders) {
    assert.ok(r.ok, `${r.id}: ${r.error}`);
    assert.ok(r.state!.interfaces.length > 0, `${r.id}: no interfaces`);
    assert.match(r.eni!, /iface /, r.id);
    assert.match(r.netplan!, /ethernets:/, r.id);
  }
});

// A default route in cloud-init's state: a subnet gateway, or a route to prefix 0.
function gatewaysOf(state: NetworkStateSummary, mac: string | undefined, name: string | undefined): string[] {
  const iface = state.interfaces.find((i) => (mac ? i.mac === mac : i.name === name));
  if (!iface) return [];
  return iface.subnets.flatMap((s) => [
    ...(s.gateway ? [s.gateway] : []),
    ...s.routes.filter((r) => r.prefix === 0).map((r) => r.gateway),
  ]);
}

test('init.nics render to the addresses, gateways, routes, MTU and DNS servers asked for', () => {
  let checked = 0;
  for (const c of cases) {
    const init = c.annotation.init as Record<string, unknown> | undefined;
    const nics = (init?.nics ?? []) as Array<Record<string, unknown>>;
    if (nics.length === 0 || c.annotation.forceDHCP) continue;
    const r = render(`out:${c.name}`)!;
    assert.ok(r?.ok, `${c.name}: ${r?.error}`);
    const dns = (init!.dns as Record<string, string[]> | undefined)?.servers ?? [];
    for (const server of dns) {
      assert.ok(r.eni!.includes(server), `${c.name}: ENI lacks DNS ${server}`);
      assert.ok(r.netplan!.includes(server), `${c.name}: netplan lacks DNS ${server}`);
    }
    for (const nic of nics) {
      const mac = nic.mac ? String(nic.mac).toLowerCase() : undefined;
      const name = nic.name as string | undefined;
      const iface = r.state!.interfaces.find((i) => (mac ? i.mac === mac : i.name === name));
      assert.ok(iface, `${c.name}: no interface for ${mac ?? name}`);
      const got = iface.subnets.filter((s) => s.address).map((s) => `${s.address}/${s.prefix}`);
      assert.deepEqual(
        got.sort(),
        [...((nic.addresses ?? []) as string[])].sort(),
        `${c.name}: addresses of ${mac ?? name}`,
      );
      for (const a of (nic.addresses ?? []) as string[]) {
        assert.ok(r.eni!.includes(a), `${c.name}: ENI lacks ${a}`);
        assert.ok(r.netplan!.includes(a), `${c.name}: netplan lacks ${a}`);
      }
      const gws = gatewaysOf(r.state!, mac, name);
      for (const g of [nic.gateway4, nic.gateway6].filter(Boolean) as string[]) {
        assert.ok(gws.includes(g), `${c.name}: default gateway ${g} missing (${gws.join(', ')})`);
        assert.ok(r.eni!.includes(g) && r.netplan!.includes(g), `${c.name}: renderers lack gateway ${g}`);
      }
      for (const rt of (nic.routes ?? []) as Array<{ to: string; via: string }>) {
        const [net, prefix] = rt.to.split('/');
        const found = iface.subnets.some((s) =>
          s.routes.some((x) => x.network === net && x.prefix === Number(prefix) && x.gateway === rt.via),
        );
        assert.ok(found, `${c.name}: route ${rt.to} via ${rt.via} missing`);
      }
      if (nic.mtu !== undefined) assert.equal(iface.mtu, nic.mtu, `${c.name}: mtu`);
      const types = new Set(iface.subnets.map((s) => s.type));
      if (nic.dhcp4) assert.ok(types.has('dhcp4') || types.has('dhcp'), `${c.name}: dhcp4`);
      if (nic.dhcp6)
        assert.ok(
          [...types].some((t) => t === 'dhcp6' || t === 'ipv6_dhcpv6-stateful'),
          `${c.name}: dhcp6`,
        );
      if (nic.slaac || nic.autoconf)
        assert.ok(iface['accept-ra'] === true || types.has('ipv6_slaac'), `${c.name}: slaac`);
      checked++;
    }
  }
  assert.ok(checked >= 6, `only ${checked} NICs checked`);
});

test('every conversion means to cloud-init what the input meant', () => {
  const ins = res.networkRenders.filter((r) => r.id.startsWith('in:'));
  for (const input of ins) {
    const name = input.id.slice(3);
    const output = render(`out:${name}`)!;
    assert.ok(input.ok, `${input.id}: ${input.error}`);
    assert.ok(output.ok, `out:${name}: ${output.error}`);
    assert.deepEqual(meaning(output.state!), meaning(input.state!), name);
  }
});

test('the meaning comparison notices a changed gateway (negative control)', () => {
  const input = res.networkRenders.find(
    (r) => r.id.startsWith('in:') && meaning(r.state!).ifaces.some((i) => i.routes.length > 0),
  )!;
  const m = meaning(input.state!);
  const changed = structuredClone(m);
  const iface = changed.ifaces.find((i) => i.routes.length > 0)!;
  iface.routes[0] = `${iface.routes[0]}0`;
  assert.notDeepEqual(changed, m);
});

test('SHA-512 crypt hashes verify with Python crypt and openssl passwd -6 for the same salt', () => {
  for (const r of res.passwords) assert.equal(r.ok, true, `${r.id}: ${r.error ?? 'crypt.crypt disagrees'}`);
  for (const p of req.passwords) {
    assert.match(p.hash, /^\$6\$[./0-9A-Za-z]{16}\$[./0-9A-Za-z]{86}$/, p.id);
    const salt = p.hash.split('$')[2];
    const o = spawnSync('openssl', ['passwd', '-6', '-salt', salt, '-stdin'], {
      input: `${p.password}\n`,
      encoding: 'utf8',
    });
    assert.equal(o.status, 0, o.stderr);
    assert.equal(o.stdout.trim(), p.hash, p.id);
  }
});

test('no clear password appears in any file of any seed', () => {
  assert.ok(clearPasswords.size >= 2);
  for (const [name, passwords] of clearPasswords) {
    const c = cases.find((x) => x.name === name)!;
    for (const f of serializeMetaData(c.seed)) {
      for (const p of passwords)
        assert.ok(!Buffer.from(f.bytes).includes(Buffer.from(p)), `${name}/${f.path} holds a clear password`);
    }
  }
});
