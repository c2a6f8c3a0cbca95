// The agent with its datasource on, against the fake API server: the event
// sequences cloud-init's own reporting code makes for a Debian 12 boot
// (test/fixtures/cloud-init-events, generate.py) posted to each VMI's report
// URL end up on the status page, /status.json, the VMI's Events and the
// metrics; a new boot starts a new timeline; a VMI whose guest read its seed
// and reported nothing shows "progress not reported".
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import pino from 'pino';
import { FakeKube } from '../support/fake-kube.ts';
import { startAgent, tempDir, vmi, waitFor } from '../support/agent-harness.ts';
import { keyLine, randomKey } from '../datasource/datasource-fixtures.ts';
import { prepareNocloudHttp } from '../../src/commands/agent/datasource.ts';
import { GUEST_BASE_URL, loopbackDatasource, startedDatasource } from '../support/agent-datasource.ts';
import { progressReportPlanner } from '../../src/agent/provisioning/report-plan.ts';
import { REPORT_PROGRESS_ANNOTATION } from '../../src/cloudinit/userdata/reporting-config.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import { reportToken } from '../../src/datasource/reports/report-token.ts';
import { findSecret, secretForms } from '../support/secret-forms.ts';
import type { VmiStatusRecord } from '../../src/status/snapshot.ts';
import { PROVISIONING_ANNOTATION, type ProvisioningSummary } from '../../src/agent/provisioning/summary.ts';

const FIXTURES = new URL('../fixtures/cloud-init-events/', import.meta.url);
const load = (f: string) => JSON.parse(readFileSync(new URL(f, FIXTURES), 'utf8')) as Array<{ name: string }>;
const SUCCESS = load('boot-success.json');
const FAILS = load('boot-scripts-user-fails.json');
const ANNOTATION_INTERVAL_MS = 1000;

async function postAll(url: string, events: object[]): Promise<number[]> {
  const statuses: number[] = [];
  for (const e of events) statuses.push((await fetch(url, { method: 'POST', body: JSON.stringify(e) })).status);
  return statuses;
}

test(
  'agent: cloud-init events reach the status page, status.json, Events and metrics; new boots; not reported',
  { timeout: 120_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    t.after(async () => {
      await fake.close();
      await dir.remove();
    });
    const keyFile = join(dir.path, 'keys');
    await writeFile(keyFile, `${keyLine(randomKey())}\n`);
    const ds = await prepareNocloudHttp(loopbackDatasource(keyFile), pino({ level: 'silent' }));
    const listener = startedDatasource(ds);
    const h = await startAgent(fake, {
      stateDir: join(dir.path, 'seeds'),
      nocloudHttp: ds.agentOptions,
      provisioningNotReportedAfterMs: 300,
      // Seeds carry the guests' URL; the test posts what a guest would to
      // the same paths on the listener's own address.
      reportPlan: progressReportPlanner({
        enabled: true,
        datasource: { keyring: ds.keyring, baseUrl: GUEST_BASE_URL },
      }),
      annotateVmis: { minIntervalMs: ANNOTATION_INTERVAL_MS, sweepMs: 50 },
      beforeStart: listener.beforeStart,
    });
    const base = listener.baseUrl;
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
    const statusJson = async () =>
      (await (await fetch(`${http.url}/status.json`)).json()) as {
        vmis: VmiStatusRecord[];
        provisioningCounts: Record<string, number>;
      };
    const statusOf = async (name: string) => (await statusJson()).vmis.find((v) => v.name === name);

    const [a, b, c] = ['a', 'b', 'c'].map((n) => fake.applyVmi(vmi(n)));
    const optedOut = vmi('d');
    optedOut.metadata.annotations = { ...optedOut.metadata.annotations, [REPORT_PROGRESS_ANNOTATION]: 'false' };
    const d = fake.applyVmi(optedOut);
    for (const n of ['a', 'b', 'c', 'd'])
      await waitFor(`seed of ${n}`, async () => (await statusOf(n))?.servedOverHttp);
    const reportUrl = (uid: string | undefined) => `${base}/${reportToken(ds.keyring, uid!)}/cloud-init-events`;

    // A good boot: every event accepted, the timeline done.
    const postedAt = Date.now();
    assert.deepEqual(new Set(await postAll(reportUrl(a.metadata.uid), SUCCESS)), new Set([200]));
    const pa = (await statusOf('a'))!.provisioning!;
    assert.equal(pa.state, 'succeeded');
    assert.equal(pa.result, 'SUCCESS');
    assert.deepEqual(
      pa.stages.map((s) => s.name),
      ['init-local', 'init-network', 'modules-config', 'modules-final'],
    );
    assert.ok(pa.stages[1].modules.some((m) => m.name === 'config-write-files' && m.result === 'SUCCESS'));
    assert.ok(pa.seconds! >= 0 && pa.seenAt !== undefined);

    // A boot whose scripts-user fails: the failing module named.
    await postAll(reportUrl(b.metadata.uid), FAILS);
    const pb = (await statusOf('b'))!.provisioning!;
    assert.equal(pb.state, 'failed');
    assert.equal(pb.failure?.step, 'modules-final/config-scripts-user');
    assert.equal(pb.failure?.description, 'running config-scripts-user with frequency once-per-instance');

    // Events on the VMIs.
    const events = await waitFor('provisioning Events', () => {
      const evs = fake.events().filter((e) => e.reason.startsWith('Provisioning'));
      return evs.length >= 2 ? evs : undefined;
    });
    const ok = events.find((e) => e.involvedObject.name === 'a')!;
    assert.equal(ok.reason, 'ProvisioningSucceeded');
    assert.equal(ok.type, 'Normal');
    assert.match(ok.message, /cloud-init finished with SUCCESS .* after the VMI was first seen \(boot 1\)/);
    const bad = events.find((e) => e.involvedObject.name === 'b')!;
    assert.equal(bad.reason, 'ProvisioningFailed');
    assert.equal(bad.type, 'Warning');
    assert.match(bad.message, /FAIL for modules-final\/config-scripts-user: running config-scripts-user/);

    // kubectl's view: each VMI's summary in its annotation, written at most
    // once per interval however many events its guest posted.
    const summaryOf = (name: string, state: string) =>
      waitFor(`${name}'s annotation: ${state}`, () => {
        const text = fake.getVmi('default', name)?.metadata.annotations?.[PROVISIONING_ANNOTATION];
        const parsed = text === undefined ? undefined : (JSON.parse(text) as ProvisioningSummary);
        return parsed?.state === state ? parsed : undefined;
      });
    assert.deepEqual(await summaryOf('a', 'succeeded'), {
      v: 1,
      state: 'succeeded',
      boot: 1,
      result: 'SUCCESS',
      at: pa.finishedAt,
      seconds: Math.round(pa.seconds! * 10) / 10,
    });
    const sb = await summaryOf('b', 'failed');
    assert.equal(sb.failedStep, 'modules-final/config-scripts-user');
    assert.equal(sb.module, 'scripts_user');
    assert.equal(sb.result, 'FAIL');
    const bound = Math.ceil((Date.now() - postedAt) / ANNOTATION_INTERVAL_MS) + 1;
    for (const name of ['a', 'b']) {
      const writes = fake.requests.filter((r) => r.verb === 'patch' && r.name === name && r.status === 200).length;
      assert.ok(writes >= 1 && writes <= bound, `${name}: ${writes} writes, at most ${bound}`);
    }

    // Metrics.
    const metrics = await (await fetch(`${http.url}/metrics`)).text();
    assert.match(metrics, /vmseed_provisioning_seconds_count\{result="success"\} 1/);
    assert.match(metrics, /vmseed_provisioning_seconds_count\{result="fail"\} 1/);
    assert.match(metrics, /vmseed_provisioning_failures_total\{module="scripts_user"\} 1/);
    assert.match(metrics, /vmseed_provisioning_vmis\{state="succeeded"\} 1/);
    assert.match(metrics, /vmseed_provisioning_vmis\{state="failed"\} 1/);

    // The page: the timeline, escaped, and the node-wide counts.
    const page = await (await fetch(`${http.url}/status/default/b`)).text();
    assert.match(page, /id="provisioning-timeline" data-provisioning="failed"/);
    for (const mark of ['VMI seen', 'seed written', 'config-scripts-user', 'init-network'])
      assert.ok(page.includes(mark), mark);
    const list = await (await fetch(`${http.url}/status`)).text();
    assert.match(list, /provisioning failed: modules-final\/config-scripts-user/);
    assert.match(list, /id="provisioning"/);

    // A new boot of a (same VMI): a new timeline, not mixed with the first.
    await postAll(reportUrl(a.metadata.uid), SUCCESS.slice(0, 3));
    const pa2 = (await statusOf('a'))!.provisioning!;
    assert.equal(pa2.boot, 2);
    assert.equal(pa2.state, 'running');
    assert.deepEqual(
      pa2.stages.map((s) => s.name),
      ['init-local'],
    );

    // c read its seed (meta-data over HTTP) and never reported.
    assert.equal((await fetch(`${base}/${ds.keyring.sign(c.metadata.uid!)}/meta-data`)).status, 200);
    const pc = await waitFor('c not reported', async () => {
      const p = (await statusOf('c'))?.provisioning;
      return p?.state === 'not-reported' ? p : undefined;
    });
    assert.match(pc.reason!, /no cloud-init event came within/);
    // d's seed asks for no reports (the VMI opted out): said as soon as it is read, with why.
    assert.equal((await fetch(`${base}/${ds.keyring.sign(d.metadata.uid!)}/meta-data`)).status, 200);
    const pd = await waitFor('d not reported', async () => {
      const p = (await statusOf('d'))?.provisioning;
      return p?.state === 'not-reported' ? p : undefined;
    });
    assert.match(pd.reason!, /the seed does not ask cloud-init to report its progress: the VMI opts out/);
    const counts = (await statusJson()).provisioningCounts;
    assert.deepEqual(counts, { running: 1, failed: 1, succeeded: 0, bootstrapped: 0, 'not-reported': 2 });
    assert.match(await (await fetch(`${http.url}/metrics`)).text(), /vmseed_seed_read_seconds_count\{via="http"\} 2/);

    // No token a guest holds reaches a log line, the page, status.json, the metrics or an Event.
    const shown = [
      h.lines.join('\n'),
      await (await fetch(`${http.url}/status`)).text(),
      await (await fetch(`${http.url}/status/default/b`)).text(),
      JSON.stringify(await statusJson()),
      await (await fetch(`${http.url}/metrics`)).text(),
      JSON.stringify(fake.events()),
      JSON.stringify([a, b, c, d].map((v) => fake.getVmi('default', v.metadata.name)?.metadata.annotations)),
    ].join('\n');
    for (const v of [a, b, c, d]) {
      for (const token of [reportToken(ds.keyring, v.metadata.uid!), ds.keyring.sign(v.metadata.uid!)]) {
        const found = findSecret(shown, secretForms(token));
        assert.equal(found, undefined, `a token of ${v.metadata.name} is shown (${found?.form})`);
      }
    }

    // Deleting b: its events are refused from then on, and nothing of it stays.
    fake.deleteVmi('default', 'b');
    await waitFor('b gone', async () => ((await statusOf('b')) === undefined ? true : undefined));
    const after = await fetch(reportUrl(b.metadata.uid), { method: 'POST', body: JSON.stringify(FAILS[0]) });
    assert.equal(after.status, 404);
  },
);
