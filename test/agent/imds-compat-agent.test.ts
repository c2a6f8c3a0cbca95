// The agent serving a VMI that carries KubeVirt IMDS's annotations, the way
// IMDS serves it: cloud-init's own read_seeded on IMDS's token-less serial
// (`s=http://<host>/v1/`) gets IMDS's meta-data and the annotation's
// user-data; no network-config (cloud-init falls back to DHCP); no seed image is written. Token-less
// answers go to IMDS-annotated VMIs only.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeKube } from '../support/fake-kube.ts';
import { imageOf, startAgent, tempDir, vmi, waitFor } from '../support/agent-harness.ts';
import { cloudInitReadSeeded, keyLine, randomKey } from '../datasource/datasource-fixtures.ts';
import { prepareNocloudHttp } from '../../src/commands/agent/datasource.ts';
import { loopbackDatasource, startedDatasource } from '../support/agent-datasource.ts';
import { datasourceSerialFor } from '../../src/datasource/url.ts';
import type { VmiObject } from '../../src/api/objects.ts';

async function statusAt(url: string): Promise<number> {
  await new Promise((r) => setTimeout(r, 100));
  return (await fetch(url)).status;
}

function reporting(v: VmiObject, ip: string): VmiObject {
  const c = structuredClone(v);
  c.status = { ...c.status, interfaces: [{ name: 'default', ipAddress: ip }] };
  return c;
}

const UD = '#cloud-config\nusers:\n  - name: admin\n';

test(
  'agent, --datasource-imds-compat: IMDS VMI served on the token-less path as IMDS does; no image; other VMIs not by address',
  { timeout: 60_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    t.after(async () => {
      await fake.close();
      await dir.remove();
    });
    const keyFile = join(dir.path, 'keys');
    await writeFile(keyFile, `${keyLine(randomKey())}\n`);
    const ds = await prepareNocloudHttp(
      loopbackDatasource(keyFile, { imdsCompat: true }),
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
    const base = `${listener.baseUrl}/`;

    // A plain vmseed VMI reporting our address: not answered token-less.
    const b = fake.applyVmi(reporting(vmi('b'), '127.0.0.1'));
    await waitFor('image of b', () => existsSync(imageOf(h.store, b)));
    await new Promise((r) => setTimeout(r, 200));
    assert.equal((await fetch(`${base}user-data`)).status, 404, 'a non-IMDS VMI is never found by address');
    fake.applyVmi(reporting(fake.getVmi('default', 'b')!, '127.0.0.9'));

    // The IMDS VMI, exactly as IMDS's README writes it (the annotations of the VM template end up on the VMI).
    const imds: VmiObject = {
      apiVersion: 'kubevirt.io/v1',
      kind: 'VirtualMachineInstance',
      metadata: {
        name: 'my-vm',
        namespace: 'default',
        labels: { 'kubevirt.io/nodeName': 'node-a' },
        annotations: { 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data': UD },
      },
      spec: { domain: { firmware: { serial: 'ds=nocloud;s=http://169.254.169.254/v1/' } } },
      status: { nodeName: 'node-a', phase: 'Running' },
    };
    const a = fake.applyVmi(reporting(imds, '127.0.0.1'));
    await waitFor('IMDS answer', async () => (await statusAt(`${base}meta-data`)) === 200);
    const r = await cloudInitReadSeeded(base);
    assert.equal(r.ok, true, r.error);
    assert.deepEqual(r.md, { 'instance-id': 'default-my-vm', 'local-hostname': 'my-vm' });
    assert.equal(Buffer.from(r.ud!, 'base64').toString(), UD);
    // IMDS answers 404, vmseed an empty file (no 10 s of retries on 24.3+); both are "none" to cloud-init.
    assert.equal(r.md && (await (await fetch(`${base}network-config`)).text()), '', 'no network-config → DHCP');
    assert.equal(existsSync(imageOf(h.store, a)), false, 'HTTP only: no seed image');
    // The token path works for it too.
    const serial = datasourceSerialFor(ds.keyring, a.metadata.uid!, listener.baseUrl);
    assert.equal(await (await fetch(`${serial.replace(/^ds=nocloud;s=/, '')}user-data`)).text(), UD);

    // Annotation edited: the next fetch sees it.
    const edited = structuredClone(fake.getVmi('default', 'my-vm')!);
    edited.metadata.annotations!['imds.kubevirt.io/user-data'] = '#cloud-config\nhostname: edited\n';
    fake.applyVmi(edited);
    await waitFor('edited user-data', async () => {
      await new Promise((res) => setTimeout(res, 100));
      return (await (await fetch(`${base}user-data`)).text()).includes('edited');
    });

    // A VMI that had a seed image switches to IMDS's annotations: its image
    // goes, and nothing of it stays on its status record.
    const bImage = imageOf(h.store, fake.getVmi('default', 'b')!);
    assert.equal(existsSync(bImage), true);
    const bImds = structuredClone(fake.getVmi('default', 'b')!);
    bImds.metadata.annotations = { 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data': UD };
    fake.applyVmi(bImds);
    await waitFor('image of b removed', () => !existsSync(bImage));
    const recB = await waitFor('b ready over HTTP', () => {
      const r = h.agent.status.get('default/b');
      return r?.state === 'ready' && r.imagePath === undefined ? r : undefined;
    });
    assert.equal(recB.contentHash, undefined);
    assert.equal(recB.files, undefined);
    assert.equal(recB.datasource, 'nocloud');
    const serialB = datasourceSerialFor(ds.keyring, bImds.metadata.uid!, listener.baseUrl);
    assert.equal(
      await (await fetch(`${serialB.replace(/^ds=nocloud;s=/, '')}meta-data`)).text(),
      JSON.stringify({ 'instance-id': 'default-b', 'local-hostname': 'b' }),
    );

    // Deleted: nothing by address or token.
    fake.deleteVmi('default', 'my-vm');
    await waitFor('404 after delete', async () => (await statusAt(`${base}meta-data`)) === 404);
    assert.equal((await fetch(`${serial.replace(/^ds=nocloud;s=/, '')}meta-data`)).status, 404);
  },
);

test(
  'agent without the HTTP datasource: an IMDS VMI is skipped with DATASOURCE_OFF, and no image is written',
  { timeout: 30_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    const h = await startAgent(fake, { stateDir: join(dir.path, 'seeds') });
    t.after(async () => {
      await h.stop();
      await fake.close();
      await dir.remove();
    });
    const v = fake.applyVmi({
      apiVersion: 'kubevirt.io/v1',
      kind: 'VirtualMachineInstance',
      metadata: {
        name: 'imds-vm',
        namespace: 'default',
        labels: { 'kubevirt.io/nodeName': 'node-a' },
        annotations: { 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data': UD },
      },
      spec: { domain: {} },
      status: { nodeName: 'node-a', phase: 'Running' },
    });
    const rec = await waitFor('status of imds-vm', () => {
      const r = h.agent.status.get('default/imds-vm');
      return r?.state === 'skipped' ? r : undefined;
    });
    assert.deepEqual(
      rec.warnings.map((w) => w.code),
      ['DATASOURCE_OFF'],
    );
    assert.match(rec.warnings[0].message, /--datasource-listen/);
    assert.equal(existsSync(imageOf(h.store, v)), false);
  },
);
