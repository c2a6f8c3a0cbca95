// The agent wiring of IMDS's /v1/identity, /v1/token and OpenStack paths:
// the VMIs the informer delivers (their serviceAccount volume, their
// launcher pods on this node in status.activePods), the datasource from
// prepareNocloudHttp with --pods-dir, tokens read from a pods tree laid out
// as the kubelet's atomic writer lays it out. Two VMIs, two pods: each gets
// its own token, an IMDS VMI by source address, an opted-in vmseed VMI under
// its token path; a VMI without a serviceAccount volume gets none.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeKube } from '../support/fake-kube.ts';
import { startAgent, tempDir, vmi, waitFor } from '../support/agent-harness.ts';
import { keyLine, randomKey } from '../datasource/datasource-fixtures.ts';
import { launcherJwt, projectedToken } from '../datasource/imds-support.ts';
import { prepareNocloudHttp } from '../../src/commands/agent/datasource.ts';
import { loopbackDatasource, startedDatasource } from '../support/agent-datasource.ts';
import type { VmiObject } from '../../src/api/objects.ts';

const POD_A = 'aaaaaaaa-0000-4000-8000-000000000001';
const POD_B = 'bbbbbbbb-0000-4000-8000-000000000002';
const TOKEN_A = launcherJwt(
  { exp: 1_700_000_000, sub: 'a' },
  { namespace: 'default', serviceAccount: 'builder', pod: POD_A },
);
const TOKEN_B = launcherJwt(
  { exp: 1_800_000_000, sub: 'b' },
  { namespace: 'default', serviceAccount: 'deployer', pod: POD_B },
);
const MD = { Metadata: 'true' };

function withPodAndAccount(v: VmiObject, pod: string, account: string | undefined, ip?: string): VmiObject {
  const c = structuredClone(v);
  if (account) c.spec.volumes = [{ name: 'sa', serviceAccount: { serviceAccountName: account } }];
  c.status = {
    ...c.status,
    phase: 'Running',
    activePods: { [pod]: c.status?.nodeName },
    ...(ip ? { interfaces: [{ name: 'default', ipAddress: ip }] } : {}),
  };
  return c;
}

test(
  'agent: identity and token per VMI from its launcher pod; none without a serviceAccount volume',
  { timeout: 90_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    t.after(async () => {
      await fake.close();
      await dir.remove();
    });
    const podsDir = join(dir.path, 'pods');
    await projectedToken(podsDir, POD_A, TOKEN_A);
    await projectedToken(podsDir, POD_B, TOKEN_B);
    const keyFile = join(dir.path, 'keys');
    await writeFile(keyFile, `${keyLine(randomKey())}\n`);
    const ds = await prepareNocloudHttp(
      loopbackDatasource(keyFile, { imdsCompat: true, podsDir }),
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
    const base = new URL(listener.baseUrl).origin;
    const get = async (path: string) => {
      const r = await fetch(`${base}${path}`, { headers: MD });
      return { status: r.status, body: await r.text() };
    };

    // An IMDS VMI at 127.0.0.1 with a serviceAccount volume.
    const imds = vmi('imds-vm');
    imds.metadata.annotations = { 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data': '#cloud-config\n' };
    fake.applyVmi(withPodAndAccount(imds, POD_A, 'builder', '127.0.0.1'));
    const id = await waitFor('identity of imds-vm', async () => {
      const r = await get('/v1/identity');
      return r.status === 200 ? r.body : undefined;
    });
    assert.equal(id, '{"namespace":"default","serviceAccountName":"builder","vmName":"imds-vm"}\n');
    assert.deepEqual(JSON.parse((await get('/v1/token')).body), {
      token: TOKEN_A,
      expirationTimestamp: '2023-11-14T22:13:20Z',
    });

    // A vmseed VMI opted in, on another pod: its own token under its token path.
    const opted = vmi('opted');
    opted.metadata.annotations!['vmseed.io/imds'] = 'true';
    const b = fake.applyVmi(withPodAndAccount(opted, POD_B, 'deployer'));
    const tokenPath = `/v1/${ds.keyring.sign(b.metadata.uid!)}`;
    const tb = await waitFor('token of opted', async () => {
      const r = await get(`${tokenPath}/token`);
      return r.status === 200 ? r.body : undefined;
    });
    assert.equal(JSON.parse(tb).token, TOKEN_B);
    assert.match((await get(`${tokenPath}/openstack/latest/meta_data.json`)).body, /"hostname":"opted"/);

    // Its serviceAccount volume removed: no token any more, identity stays.
    const c = structuredClone(fake.getVmi('default', 'opted')!);
    delete c.spec.volumes;
    fake.applyVmi(c);
    await waitFor('token refused', async () => (await get(`${tokenPath}/token`)).status === 500);
    assert.equal(JSON.parse((await get(`${tokenPath}/identity`)).body).serviceAccountName, 'default');
    assert.equal(JSON.parse((await get('/v1/token')).body).token, TOKEN_A, 'the IMDS VMI still its own');
  },
);
