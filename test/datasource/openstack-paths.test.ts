// The OpenStack metadata tree on the real datasource listener, read by
// cloud-init's own OpenStack MetadataReader (Debian's cloud-init): the
// files are the bytes of the VMI's ConfigDrive image (a ConfigDrive seed),
// or the ConfigDrive form of its NoCloud seed (an IMDS VMI), by source
// address without the Metadata header (as IMDS and cloudbase-init expect)
// or under an opted-in VMI's token path.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { configdriveFiles } from '../../src/disk/configdrive.ts';
import type { Seed } from '../../src/cloudinit/seed.ts';
import { MapDirectory, nocloudSeed, quietLogger, randomKey } from './datasource-fixtures.ts';
import { entry, facts, get } from './imds-support.ts';

const enc = (s: string) => new TextEncoder().encode(s);
const CONFIGDRIVE: Seed = {
  datasource: 'configdrive',
  metaData: {
    uuid: 'cd-uuid-1',
    instance_id: 'cd-uuid-1',
    hostname: 'cd-host',
    public_keys: { k: 'ssh-ed25519 AAAA k' },
  },
  userData: enc('#cloud-config\nruncmd: [echo configdrive]\n'),
  networkConfig: enc(
    '{"links":[{"id":"eth0","type":"phy","ethernet_mac_address":"52:54:00:12:34:56"}],"networks":[{"id":"n0","link":"eth0","type":"ipv4","ip_address":"10.0.0.5","netmask":"255.255.255.0"}],"services":[]}',
  ),
  vendorData: enc('{"cloud-init":"#cloud-config\\nbootcmd: [echo vendor]\\n"}'),
  warnings: [],
};

let server: DatasourceServer;
let port: number;
const keyring = new DatasourceKeyring([randomKey()]);
const dir = new MapDirectory();

before(async () => {
  dir.add(entry('imds', nocloudSeed('imds', { delivery: 'http', networkConfig: undefined }), facts()), ['127.0.0.1']);
  dir.add(entry('cd', CONFIGDRIVE, facts()));
  dir.add(entry('off', CONFIGDRIVE, facts({ enabled: false })), ['127.0.0.4']);
  server = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: dir,
    keyring,
    logger: quietLogger,
    compatSourceAddress: true,
  });
  port = server.address.port;
});
after(() => server.close());

interface Read {
  ok: boolean;
  error?: string;
  metadata?: Record<string, unknown>;
  userdata?: string;
  vendordata?: unknown;
  networkdata?: unknown;
}

// cloud-init's MetadataReader.read_v2 as DataSourceOpenStack calls it,
// without retries; its EC2 side (a fixed 169.254.169.254 address, not part
// of the OpenStack tree) is stubbed out.
const READ_V2 = `
import base64, json, sys
from cloudinit.sources.helpers import openstack
r = openstack.MetadataReader(sys.argv[1], timeout=5, retries=0)
r._read_ec2_metadata = lambda: {}
try:
    res = r.read_v2()
    ud = res.get("userdata")
    print(json.dumps({"ok": True, "metadata": res["metadata"], "userdata": base64.b64encode(ud if isinstance(ud, bytes) else ud.encode()).decode(), "vendordata": res.get("vendordata"), "networkdata": res.get("networkdata")}))
except Exception as e:
    print(json.dumps({"ok": False, "error": type(e).__name__ + ": " + str(e)}))
`;

function readV2(base: string): Promise<Read> {
  return new Promise((resolve, reject) => {
    execFile('/usr/bin/python3', ['-c', READ_V2, base], { timeout: 60_000 }, (err, stdout, stderr) => {
      if (err) return reject(new Error(`python3 failed: ${err.message}\n${stderr}`));
      resolve(JSON.parse(stdout) as Read);
    });
  });
}

const b64 = (u: Uint8Array) => Buffer.from(u).toString('base64');

test('ConfigDrive seed under its token path: MetadataReader reads the image bytes', { timeout: 90_000 }, async () => {
  const base = `http://127.0.0.1:${port}/v1/${keyring.sign('uid-cd')}`;
  const r = await readV2(base);
  assert.ok(r.ok, r.error);
  assert.equal(r.metadata?.uuid, 'cd-uuid-1');
  assert.equal(r.metadata?.['instance-id'], 'cd-uuid-1', "cloud-init's KEY_COPIES ran");
  assert.equal(r.userdata, b64(CONFIGDRIVE.userData));
  assert.deepEqual(r.vendordata, { 'cloud-init': '#cloud-config\nbootcmd: [echo vendor]\n' });
  assert.equal((r.networkdata as { networks: Array<{ ip_address: string }> }).networks[0].ip_address, '10.0.0.5');
  // Byte for byte the files the ConfigDrive image holds.
  for (const f of configdriveFiles(CONFIGDRIVE)) {
    const a = await get(port, `/v1/${keyring.sign('uid-cd')}/${f.path}`);
    assert.equal(a.status, 200, f.path);
    assert.equal(a.body, Buffer.from(f.data).toString('utf8'), f.path);
  }
  const listing = await get(port, `/v1/${keyring.sign('uid-cd')}/openstack/latest/`);
  assert.equal(listing.body, 'meta_data.json\nuser_data\nnetwork_data.json\nvendor_data.json\n');
  assert.equal((await get(port, `/v1/${keyring.sign('uid-cd')}/openstack`)).body, 'latest\n');
});

test(
  'IMDS VMI by source address, no Metadata header: the ConfigDrive form of its seed',
  { timeout: 90_000 },
  async () => {
    const r = await readV2(`http://127.0.0.1:${port}`);
    assert.ok(r.ok, r.error);
    assert.deepEqual(
      { uuid: r.metadata?.uuid, hostname: r.metadata?.hostname, name: r.metadata?.name },
      { uuid: 'iid-imds', hostname: 'host-imds', name: 'host-imds' },
      "IMDS's own meta_data.json keys",
    );
    assert.equal(r.userdata, b64(nocloudSeed('imds').userData));
    assert.deepEqual(r.vendordata, { 'cloud-init': '#cloud-config\nbootcmd: [echo vendor-imds]\n' });
    assert.equal(r.networkdata ?? null, null, 'no network config: DHCP');
    const md = await get(port, '/openstack/latest/meta_data.json');
    assert.equal(md.headers['content-type'], 'application/json');
    assert.equal(md.body, '{"uuid":"iid-imds","instance_id":"iid-imds","hostname":"host-imds","name":"host-imds"}');
    assert.equal((await get(port, '/openstack/latest/')).body, 'meta_data.json\nuser_data\nvendor_data.json\n');
    assert.equal((await get(port, '/openstack/latest/network_data.json')).status, 404);
  },
);

test('OpenStack paths: VMIs not opted in, unknown addresses and odd paths get 404', { timeout: 30_000 }, async () => {
  for (const [path, from] of [
    ['/openstack/latest/user_data', '127.0.0.4'],
    ['/openstack/latest/user_data', '127.0.0.3'],
    [`/v1/${keyring.sign('uid-off')}/openstack/latest/user_data`, '127.0.0.1'],
    ['/openstack/latest/../latest/user_data', '127.0.0.1'],
    ['/openstack/2012-08-10/user_data', '127.0.0.1'],
    ['/openstack/latest/user_data?x', '127.0.0.1'],
  ] as const) {
    const r = await get(port, path, {}, from);
    assert.equal(r.status, 404, `${path} from ${from}`);
    assert.ok(!r.body.includes('secret-of'), path);
  }
});

test(
  'a NoCloud seed with network config: network_data.json converted, as ConfigDrive renders it',
  { timeout: 90_000 },
  async () => {
    dir.add(entry('net', nocloudSeed('net'), facts()));
    const r = await readV2(`http://127.0.0.1:${port}/v1/${keyring.sign('uid-net')}`);
    assert.ok(r.ok, r.error);
    const nd = r.networkdata as { links: Array<{ id: string }>; networks: Array<{ type: string; link: string }> };
    assert.equal(nd.links[0].id, 'eth0');
    assert.equal(nd.networks[0].type, 'ipv4_dhcp');
  },
);
