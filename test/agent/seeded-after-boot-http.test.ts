// The HTTP datasource's SEEDED_AFTER_BOOT, through the agent: a guest that
// asks with its token while its seed cannot be rendered yet (its Secret not
// created), then gets it, leaves the warning on its status, a SeedWarning
// Event and one count; a VMI whose guest asks after the seed is served
// leaves nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { fakeKubeAndDir, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { randomKey } from '../datasource/datasource-fixtures.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';

test(
  'agent: a guest that fetched before its seed was served is SEEDED_AFTER_BOOT (status, Event, counter); one on time is not',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const keyring = new DatasourceKeyring([randomKey()]);
    let server: DatasourceServer | undefined;
    const h = await startAgent(fake, {
      stateDir: dir.path,
      nocloudHttp: {},
      beforeStart: async (agent) => {
        server = await startDatasourceServer({
          listen: { host: '127.0.0.1', port: 0 },
          directory: agent.seeds!,
          keyring,
          logger: pino({ level: 'silent' }),
        });
      },
    });
    t.after(async () => {
      await server?.close();
      await h.stop();
    });
    const fetchStatus = async (uid: string, file = 'meta-data') =>
      (await fetch(`${server!.baseUrl}/${keyring.sign(uid)}/${file}`)).status;
    const counted = async () =>
      (await h.metrics.seededAfterBoot.get()).values.find((v) => v.labels.datasource === 'nocloud-http')?.value;
    const warningsOf = (name: string) => h.agent.status.get(`default/${name}`)?.warnings.map((w) => w.code) ?? [];

    const onTime = fake.applyVmi(vmi('on-time'));
    await waitFor('on-time ready', () => h.agent.status.get('default/on-time')?.state === 'ready');
    assert.equal(await fetchStatus(onTime.metadata.uid!), 200);

    const early = fake.applyVmi(vmi('early', { cloudInit: 'secretRef: {name: late-ud}\n' }));
    await waitFor('early fails on its missing Secret', () => h.agent.status.get('default/early')?.state === 'error');
    assert.equal(await fetchStatus(early.metadata.uid!), 404, 'no seed yet');
    fake.setSecret({
      metadata: { name: 'late-ud', namespace: 'default' },
      stringData: { userdata: '#cloud-config\nhostname: early\n' },
    });
    await waitFor('early seeded', () => h.agent.status.get('default/early')?.state === 'ready', 30_000);
    assert.equal(await counted(), 0, 'not counted before the guest gets its seed');
    assert.equal(await fetchStatus(early.metadata.uid!), 200);

    await waitFor('SEEDED_AFTER_BOOT on early', () => warningsOf('early').includes('SEEDED_AFTER_BOOT'));
    const rec = h.agent.status.get('default/early')!;
    assert.equal(rec.state, 'warning');
    const w = rec.warnings.find((x) => x.code === 'SEEDED_AFTER_BOOT')!;
    assert.match(w.message, /before it was served/);
    assert.match(w.message, /startStrategy: Paused/);
    assert.match(w.message, /deploy\/webhook/);
    assert.equal(await counted(), 1);
    const event = await waitFor('SeedWarning Event', () =>
      fake.events().find((e) => e.involvedObject.name === 'early' && /^SEEDED_AFTER_BOOT: /.test(e.message ?? '')),
    );
    assert.equal(event.reason, 'SeedWarning');
    assert.equal(event.type, 'Warning');

    // Once per object: more fetches, a resync and a re-render keep the
    // warning and do not count again.
    assert.equal(await fetchStatus(early.metadata.uid!, 'user-data'), 200);
    h.agent.resync();
    fake.setSecret({
      metadata: { name: 'late-ud', namespace: 'default' },
      stringData: { userdata: '#cloud-config\nhostname: early-2\n' },
    });
    await waitFor('early re-rendered', () =>
      /early-2/.test(Buffer.from(h.agent.seeds!.get(early.metadata.uid!)?.seed.userData ?? []).toString()),
    );
    await waitFor('early settled', () => h.agent.status.get('default/early')?.state === 'warning');
    assert.ok(warningsOf('early').includes('SEEDED_AFTER_BOOT'), 'kept across reconciles');
    assert.equal(await counted(), 1);
    assert.deepEqual(warningsOf('on-time'), []);
  },
);
