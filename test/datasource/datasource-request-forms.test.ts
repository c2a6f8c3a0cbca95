// Every request form cloud-init uses for a NoCloud seed over HTTP, made by
// cloud-init's own DataSourceNoCloud code (the installed 22.4, and 25.1 from
// Debian trixie) against the real listener, starting from the DMI serial a
// guest without a seed disk has:
//   - 22.4: meta-data, user-data, vendor-data; names appended raw to `s=`;
//     `ds=nocloud` with an http seed stays dsmode local (the network stage
//     then exits), so such guests need `ds=nocloud-net`;
//   - 25.1: network-config first, a `/` appended when missing, `ds=nocloud`
//     with an http seed is dsmode net, `ds=nocloud-net` still honoured;
//   - `%s` in the seed URL is replaced by each name in both.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { load as loadYaml } from 'js-yaml';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';
import { imdsOnlySourceAddress } from '../../src/datasource/imds/compat.ts';
import { DatasourceKeyring, signToken } from '../../src/datasource/tokens.ts';
import { datasourceSeedUrl, datasourceSerial } from '../../src/datasource/url.ts';
import { MapDirectory, nocloudSeed, quietLogger, randomKey } from './datasource-fixtures.ts';
import { ensureCloudInitRelease } from '../support/cloud-init-release.ts';

interface NoCloudRun {
  claimed: boolean;
  error?: string;
  dsmode?: string;
  metadata?: Record<string, unknown>;
  userdata?: string | null;
  vendordata?: string | null;
  network_config?: unknown;
  ds_detect?: boolean;
  seconds: number;
  requests: Array<{ url: string; code: number | null }>;
}

function runNoCloud(
  tree: string,
  serial: string,
  ds: 'NoCloud' | 'NoCloudNet',
  retries: number | 'default' = 0,
): Promise<NoCloudRun> {
  return new Promise((resolve, reject) => {
    execFile(
      '/usr/bin/python3',
      ['test/datasource/nocloud_datasource.py', tree, serial, ds, String(retries)],
      { timeout: 120_000 },
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`python3 failed: ${err.message}\n${stderr}`));
        resolve(JSON.parse(stdout.trim().split('\n').at(-1)!) as NoCloudRun);
      },
    );
  });
}

const b64 = (u: Uint8Array | undefined) => (u === undefined ? undefined : Buffer.from(u).toString('base64'));
const withoutCmdline = (md: Record<string, unknown> | undefined) => {
  const { seedfrom: _s, ...rest } = md ?? {};
  return rest;
};
const paths = (r: NoCloudRun) =>
  r.requests.map((q) => `${new URL(q.url).pathname.replace(/\/v1\/[A-Za-z0-9_-]{43}/, '/v1/<token>')} ${q.code}`);

describe('cloud-init request forms against the running datasource', () => {
  const dir = new MapDirectory();
  const keyring = new DatasourceKeyring([randomKey()]);
  const seedA = nocloudSeed('a');
  const seedB = nocloudSeed('b', { vendorData: undefined, networkConfig: undefined });
  let server: DatasourceServer;
  let current: string;
  let urlA: string;
  let urlB: string;
  const releases = [
    { name: '22.4 (installed)', tree: () => '', v: 22 },
    { name: '25.1 (trixie)', tree: () => current, v: 25 },
  ];
  before(async () => {
    current = await ensureCloudInitRelease();
    dir.add({ namespace: 'ns', name: 'a', uid: 'uid-a', seed: seedA });
    dir.add({ namespace: 'ns', name: 'b', uid: 'uid-b', seed: seedB });
    server = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: quietLogger,
    });
    urlA = datasourceSeedUrl(server.baseUrl, keyring.sign('uid-a'));
    urlB = datasourceSeedUrl(server.baseUrl, keyring.sign('uid-b'));
  });
  after(() => server.close());

  for (const rel of releases) {
    test(`${rel.name}: ds=nocloud;s=<seed-url>/ — the seed, every file cloud-init asks for`, async () => {
      const r = await runNoCloud(rel.tree(), datasourceSerial(urlA, 'nocloud'), 'NoCloudNet');
      assert.equal(r.claimed, true, r.error);
      assert.deepEqual(withoutCmdline(r.metadata), seedA.metaData);
      assert.equal(r.userdata, b64(seedA.userData));
      assert.equal(r.vendordata, b64(seedA.vendorData));
      if (rel.v === 22) {
        assert.deepEqual(paths(r), [
          '/v1/<token>/meta-data 200',
          '/v1/<token>/user-data 200',
          '/v1/<token>/vendor-data 200',
        ]);
        assert.equal(r.network_config, null, '22.4 never fetches network-config over HTTP');
        assert.equal(
          r.dsmode,
          'local',
          '22.4: ds=nocloud keeps dsmode local even with an http seed; use ds=nocloud-net',
        );
      } else {
        assert.deepEqual(paths(r), [
          '/v1/<token>/network-config 200',
          '/v1/<token>/meta-data 200',
          '/v1/<token>/user-data 200',
          '/v1/<token>/vendor-data 200',
        ]);
        assert.deepEqual(r.network_config, loadYaml(Buffer.from(seedA.networkConfig!).toString()));
        assert.equal(r.dsmode, 'net');
        assert.equal(r.ds_detect, true);
      }
    });

    test(`${rel.name}: ds=nocloud-net (older guests; deprecated in 24.1 but honoured) — dsmode net`, async () => {
      const r = await runNoCloud(rel.tree(), datasourceSerial(urlA, 'nocloud-net'), 'NoCloudNet');
      assert.equal(r.claimed, true, r.error);
      assert.equal(r.dsmode, 'net');
      assert.deepEqual(withoutCmdline(r.metadata), seedA.metaData);
      assert.equal(r.userdata, b64(seedA.userData));
      if (rel.v === 25) assert.equal(r.ds_detect, true);
    });

    test(`${rel.name}: seed URL without its trailing slash`, async () => {
      const r = await runNoCloud(rel.tree(), datasourceSerial(urlA.replace(/\/$/, ''), 'nocloud-net'), 'NoCloudNet');
      assert.equal(r.claimed, true, r.error);
      assert.equal(r.userdata, b64(seedA.userData));
      // 22.4 concatenates raw (/v1/<token>meta-data); 23.1+ appends the slash.
      assert.equal(
        paths(r).find((p) => p.includes('meta-data')),
        rel.v === 22 ? '/v1/<token>meta-data 200' : '/v1/<token>/meta-data 200',
      );
    });

    test(`${rel.name}: seed URL with %s`, async () => {
      const r = await runNoCloud(rel.tree(), `ds=nocloud-net;s=${urlA}%s`, 'NoCloudNet');
      assert.equal(r.claimed, true, r.error);
      assert.deepEqual(withoutCmdline(r.metadata), seedA.metaData);
      assert.equal(r.vendordata, b64(seedA.vendorData));
    });

    test(`${rel.name}: seed without network-config or vendor-data — empty files, read as none (DHCP fallback)`, async () => {
      const r = await runNoCloud(rel.tree(), datasourceSerial(urlB, 'nocloud-net'), 'NoCloudNet');
      assert.equal(r.claimed, true, r.error);
      assert.equal(r.network_config, null, 'no network-config: cloud-init uses its fallback (DHCP)');
      assert.equal(r.vendordata, '');
      if (rel.v === 25) assert.equal(paths(r)[0], '/v1/<token>/network-config 200');
    });

    test(`${rel.name}: with serveEmptyNetworkConfig off, the 404 means the same to cloud-init (none, DHCP)`, async () => {
      const s = await startDatasourceServer({
        listen: { host: '127.0.0.1', port: 0 },
        directory: dir,
        keyring,
        logger: quietLogger,
        serveEmptyNetworkConfig: false,
      });
      try {
        const r = await runNoCloud(
          rel.tree(),
          datasourceSerial(datasourceSeedUrl(s.baseUrl, keyring.sign('uid-b')), 'nocloud-net'),
          'NoCloudNet',
        );
        assert.equal(r.claimed, true, r.error);
        assert.equal(r.network_config, null);
        assert.equal(r.userdata, b64(seedB.userData));
        if (rel.v === 25) assert.equal(paths(r)[0], '/v1/<token>/network-config 404');
      } finally {
        await s.close();
      }
    });

    test(`${rel.name}: the local-stage NoCloud never fetches an http seed`, async () => {
      const r = await runNoCloud(rel.tree(), datasourceSerial(urlA, 'nocloud'), 'NoCloud');
      assert.equal(r.claimed, false);
      assert.deepEqual(r.requests, []);
    });

    test(`${rel.name}: a made-up token is 404 and the datasource is not claimed`, async () => {
      const r = await runNoCloud(
        rel.tree(),
        datasourceSerial(datasourceSeedUrl(server.baseUrl, signToken(randomKey(), 'uid-a')), 'nocloud-net'),
        'NoCloudNet',
      );
      assert.equal(r.claimed, false);
      assert.match(r.error ?? '', /404/);
    });
  }

  test('KubeVirt IMDS serial (token-less /v1/) with IMDS compat: both releases get the IMDS VMI, never another VMI', async () => {
    const d = new MapDirectory();
    const imdsSeed = nocloudSeed('imds', {
      metaData: { 'instance-id': 'ns-vm', 'local-hostname': 'vm' },
      networkConfig: undefined,
      vendorData: undefined,
      delivery: 'http',
    });
    d.add({ namespace: 'ns', name: 'vm', uid: 'uid-imds', seed: imdsSeed }, ['127.0.0.1']);
    const s = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: imdsOnlySourceAddress(d),
      keyring,
      logger: quietLogger,
      compatSourceAddress: true,
    });
    try {
      const serial = `ds=nocloud-net;s=http://127.0.0.1:${s.address.port}/v1/`;
      for (const rel of releases) {
        const r = await runNoCloud(rel.tree(), serial, 'NoCloudNet');
        assert.equal(r.claimed, true, `${rel.name}: ${r.error}`);
        assert.deepEqual(withoutCmdline(r.metadata), { 'instance-id': 'ns-vm', 'local-hostname': 'vm' });
        assert.equal(r.userdata, b64(imdsSeed.userData));
      }
      // The same address reported by a non-IMDS VMI only: nothing.
      const d2 = new MapDirectory();
      d2.add({ namespace: 'ns', name: 'plain', uid: 'uid-p', seed: seedA }, ['127.0.0.1']);
      const s2 = await startDatasourceServer({
        listen: { host: '127.0.0.1', port: 0 },
        directory: imdsOnlySourceAddress(d2),
        keyring,
        logger: quietLogger,
        compatSourceAddress: true,
      });
      try {
        const r = await runNoCloud('', `ds=nocloud-net;s=http://127.0.0.1:${s2.address.port}/v1/`, 'NoCloudNet');
        assert.equal(r.claimed, false);
        assert.match(r.error ?? '', /404/);
      } finally {
        await s2.close();
      }
    } finally {
      await s.close();
    }
  });
});
