// The agent with its NoCloud HTTP datasource on, against the fake API
// server: cloud-init's own read_seeded fetches the seed through the URL
// seed-url's code computes from the live keyring (the status page only says
// the seed is served: the serial's token is never on a page), and gets exactly the bytes of the image on disk; the
// guest's fetch shows on the status page; deleting the VMI makes its token
// 404; keys rotate through the key file while the agent runs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { writeFile, rename } from 'node:fs/promises';
import { join } from 'node:path';
import { load as loadYaml } from 'js-yaml';
import { FakeKube } from '../support/fake-kube.ts';
import { imageOf, startAgent, tempDir, vmi, waitFor } from '../support/agent-harness.ts';
import { cloudInitReadSeeded, keyLine, randomKey } from '../datasource/datasource-fixtures.ts';
import { prepareNocloudHttp } from '../../src/commands/agent/datasource.ts';
import { loopbackDatasource, startedDatasource } from '../support/agent-datasource.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';
import type { VmiStatusRecord } from '../../src/status/snapshot.ts';
import { datasourceSerialFor } from '../../src/datasource/url.ts';
import type { DatasourceKeyring } from '../../src/datasource/tokens.ts';

// Written the way a Secret volume changes: a new file renamed over the old.
async function writeKeys(path: string, text: string): Promise<void> {
  await writeFile(`${path}.tmp`, text);
  await rename(`${path}.tmp`, path);
}

// Polls the datasource below its per-source rate limit (20/s), so a slow
// wait never turns into 429s.
async function statusAt(url: string): Promise<number> {
  await new Promise((r) => setTimeout(r, 100));
  return (await fetch(url)).status;
}

// What `vmseed seed-url` prints for a VMI the status page says is served.
function seedUrlFrom(keyring: DatasourceKeyring, base: string): (r: VmiStatusRecord | undefined) => string | undefined {
  return (r) =>
    r?.servedOverHttp ? /^ds=nocloud;s=(\S+)$/.exec(datasourceSerialFor(keyring, r.uid, base))?.[1] : undefined;
}

test(
  'agent datasource: read_seeded gets the image bytes via the status page URL; fetch recorded; delete → 404; key rotation at run time',
  { timeout: 60_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    t.after(async () => {
      await fake.close();
      await dir.remove();
    });
    const keyFile = join(dir.path, 'keys');
    const keyA = keyLine(randomKey());
    const keyB = keyLine(randomKey());
    await writeKeys(keyFile, `${keyA}\n`);
    const stateDir = join(dir.path, 'seeds');

    // A logger for the wiring that the harness's capture can read.
    const ds = await prepareNocloudHttp(loopbackDatasource(keyFile), (await import('pino')).pino({ level: 'silent' }));
    const listener = startedDatasource(ds);
    const h = await startAgent(fake, {
      stateDir,
      nocloudHttp: ds.agentOptions,
      beforeStart: listener.beforeStart,
    });
    // The serial as seed-url computes it for a datasource the test reaches here.
    const seedUrlOf = seedUrlFrom(ds.keyring, listener.baseUrl);
    const http = await startHttpServer({
      listen: '127.0.0.1:0',
      metrics: h.metrics,
      status: h.agent.status,
      logger: h.logger,
    });
    t.after(async () => {
      await http.close();
      await listener.close();
      await h.stop();
    });
    const statusOf = async (name: string): Promise<VmiStatusRecord | undefined> => {
      const body = (await (await fetch(`${http.url}/status.json`)).json()) as { vmis: VmiStatusRecord[] };
      return body.vmis.find((v) => v.name === name);
    };

    const a = fake.applyVmi(
      vmi('a', { cloudInit: 'userData: |\n  #cloud-config\n  hostname: alpha\n  packages: [htop]\n' }),
    );
    fake.applyVmi(vmi('b'));
    await waitFor('image of a', () => existsSync(imageOf(h.store, a)));
    const imageA = imageOf(h.store, a);
    const recA = await waitFor('serial of a on /status.json', async () => {
      const r = await statusOf('a');
      return seedUrlOf(r) ? r : undefined;
    });
    const urlA = seedUrlOf(recA)!;
    assert.ok(urlA.startsWith(`${listener.baseUrl}/`) && urlA.endsWith('/'), urlA);
    assert.equal(recA.lastFetch, undefined, 'nothing fetched yet');
    // The detail page says how to get the serial, and never shows its token.
    const page = await (await fetch(`${http.url}/status/default/a`)).text();
    assert.ok(page.includes(`vmseed seed-url default/a --uid ${a.metadata.uid}`), 'seed-url hint on the detail page');
    assert.ok(!page.includes(urlA.split('/').at(-2)!), 'no token on the detail page');

    // cloud-init's reader against the agent's listener: exactly the image's files.
    const iso = readIso(readFileSync(imageA));
    const fileOf = (n: string) => {
      const e = iso.entries.find((x) => x.path.replace(/^\//, '') === n);
      assert.ok(e, `${n} in the image (${iso.entries.map((x) => x.path).join(', ')})`);
      return Buffer.from(iso.read(e.path)!);
    };
    const r = await cloudInitReadSeeded(urlA);
    assert.equal(r.ok, true, r.error);
    assert.equal(r.ud, fileOf('user-data').toString('base64'));
    assert.deepEqual(r.md, loadYaml(fileOf('meta-data').toString('utf8')));
    for (const f of ['meta-data', 'user-data']) {
      const res = await fetch(`${urlA}${f}`);
      assert.equal(res.status, 200);
      assert.ok(Buffer.from(await res.arrayBuffer()).equals(fileOf(f)), `${f} byte for byte`);
    }
    const fetched = await waitFor('lastFetch of a', async () => (await statusOf('a'))?.lastFetch?.['user-data']);
    assert.ok(Date.now() - Date.parse(fetched) < 30_000);
    assert.match(await (await fetch(`${http.url}/status/default/a`)).text(), /the guest fetched user-data at/);
    assert.match(await (await fetch(`${http.url}/status`)).text(), /the guest fetched user-data \d+s ago/);

    // One VMI's token does not open another's seed: b has its own.
    const urlB = seedUrlOf(
      await waitFor('serial of b', async () => (seedUrlOf(await statusOf('b')) ? await statusOf('b') : undefined)),
    )!;
    assert.notEqual(urlB, urlA);
    const udB = await (await fetch(`${urlB}user-data`)).text();
    assert.match(udB, /hostname: b/);
    assert.doesNotMatch(udB, /alpha/);

    // Rotation: B signs, A still accepted. The status page follows the file.
    await writeKeys(keyFile, `${keyB}\n${keyA}\n`);
    const recA2 = await waitFor('new serial after rotation', async () => {
      const x = await statusOf('a');
      return seedUrlOf(x) !== urlA ? x : undefined;
    });
    const urlA2 = seedUrlOf(recA2)!;
    assert.equal((await fetch(`${urlA2}user-data`)).status, 200, 'new token served');
    assert.equal((await fetch(`${urlA}user-data`)).status, 200, 'old token still accepted while its key is listed');
    // A broken key file keeps the keys in force.
    await writeKeys(keyFile, 'not a key\n');
    await new Promise((res) => setTimeout(res, 500));
    assert.equal(seedUrlOf(await statusOf('a')), urlA2, 'serial unchanged after a bad key file');
    assert.equal((await fetch(`${urlA}user-data`)).status, 200, 'old keys kept after a failed reload');
    // Dropping A retires its tokens.
    await writeKeys(keyFile, `${keyB}\n`);
    await waitFor('old token refused', async () => (await statusAt(`${urlA}user-data`)) === 404);
    assert.equal((await fetch(`${urlA2}user-data`)).status, 200);

    // The VMI goes: its image and its seed go, the token is 404.
    fake.deleteVmi('default', 'a');
    await waitFor('image of a removed', () => !existsSync(imageA));
    for (const f of ['meta-data', 'user-data', 'vendor-data', 'network-config']) {
      const res = await fetch(`${urlA2}${f}`);
      assert.equal(res.status, 404, f);
      assert.equal(await res.text(), 'not found\n');
    }
    assert.equal((await fetch(`${urlB}user-data`)).status, 404, "b's token under the retired key is refused");
    const urlB2 = seedUrlOf(await statusOf('b'))!;
    assert.equal((await fetch(`${urlB2}user-data`)).status, 200, 'b is still served');
    assert.equal(h.agent.seeds!.size, 1);
  },
);

test(
  'agent datasource, compat mode: token-less /v1/<file> answered by the source address the VMI reports; shared address → 404',
  { timeout: 30_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    t.after(async () => {
      await fake.close();
      await dir.remove();
    });
    const keyFile = join(dir.path, 'keys');
    await writeKeys(keyFile, `${keyLine(randomKey())}\n`);
    const ds = await prepareNocloudHttp(
      loopbackDatasource(keyFile, { compatSourceAddress: true }),
      (await import('pino')).pino({ level: 'silent' }),
    );
    const listener = startedDatasource(ds);
    const h = await startAgent(fake, {
      stateDir: join(dir.path, 'seeds'),
      nocloudHttp: ds.agentOptions,
      beforeStart: listener.beforeStart,
    });
    t.after(async () => {
      await listener.close();
      await h.stop();
    });
    const base = listener.baseUrl;
    // Not reported yet (first boot): nothing to match.
    const a = fake.applyVmi(vmi('a'));
    await waitFor('seed of a', () => h.agent.seeds!.get(a.metadata.uid!));
    assert.equal((await fetch(`${base}/user-data`)).status, 404);
    // The guest agent reports 127.0.0.1 (this test's source address).
    const withIp = structuredClone(fake.getVmi('default', 'a')!);
    withIp.status = { ...withIp.status, interfaces: [{ name: 'default', ipAddress: '127.0.0.1' }] };
    fake.applyVmi(withIp);
    await waitFor('compat answer', async () => (await statusAt(`${base}/user-data`)) === 200);
    assert.match(await (await fetch(`${base}/user-data`)).text(), /hostname: a/);
    // A second VMI claims the same address: ambiguous, nobody gets a seed.
    const b = fake.applyVmi(vmi('b'));
    const bIp = structuredClone(b);
    bIp.status = { ...bIp.status, interfaces: [{ ipAddresses: ['127.0.0.1'] }] };
    fake.applyVmi(bIp);
    await waitFor('ambiguous → 404', async () => (await statusAt(`${base}/user-data`)) === 404);
    // Tokens keep working beside compat mode.
    const serial = datasourceSerialFor(ds.keyring, a.metadata.uid!, base);
    assert.equal((await fetch(`${serial.replace(/^ds=nocloud;s=/, '')}user-data`)).status, 200);
  },
);
