// Cluster API bootstrap data through the agent, against the fake API server:
// VMIs seeded with user-data laid out as CABPK writes it (test/fixtures/cabpk)
// and the event sequences cloud-init's own reporting code makes for a Debian
// 12 boot (test/fixtures/cloud-init-events). A control plane whose runcmd
// ends with the sentinel write and whose boot succeeds is `bootstrapped`
// (annotation v1, "sentinel":"written", the Event says so); the same one
// whose scripts_user fails is `failed`; a join whose postKubeadmCommands
// follow stays `succeeded` with "sentinel":"unverified", as does a reboot.
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
import { startHttpServer } from '../../src/http/status-server.ts';
import { reportToken } from '../../src/datasource/reports/report-token.ts';
import type { VmiStatusRecord } from '../../src/status/snapshot.ts';
import { PROVISIONING_ANNOTATION, type ProvisioningSummary } from '../../src/agent/provisioning/summary.ts';
import { sentinelOf } from '../../src/agent/provisioning/tracker.ts';
import { applyEvent, type ProvisioningFacts } from '../../src/agent/provisioning/timeline.ts';
import type { VmiRecord } from '../../src/agent/vmi-records.ts';

const FIXTURES = new URL('../fixtures/', import.meta.url);
const events = (f: string) =>
  JSON.parse(readFileSync(new URL(`cloud-init-events/${f}`, FIXTURES), 'utf8')) as Array<{ name: string }>;
const SUCCESS = events('boot-success.json');
const FAILS = events('boot-scripts-user-fails.json');
const cabpk = (f: string) => readFileSync(new URL(`cabpk/${f}`, FIXTURES), 'utf8');
// vmseed.io/cloud-init with the bootstrap data as its user-data.
const seededWith = (userData: string) => `userData: |\n${userData.replace(/^(?=.)/gm, '  ')}`;

async function postAll(url: string, posted: object[]): Promise<void> {
  for (const e of posted) {
    const res = await fetch(url, { method: 'POST', body: JSON.stringify(e) });
    assert.equal(res.status, 200);
  }
}

test(
  'agent: CABPK bootstrap data whose boot succeeds is bootstrapped (v1 annotation, Event); a FAIL is failed',
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
      reportPlan: progressReportPlanner({
        enabled: true,
        datasource: { keyring: ds.keyring, baseUrl: GUEST_BASE_URL },
      }),
      annotateVmis: { minIntervalMs: 100, sweepMs: 50 },
      beforeStart: listener.beforeStart,
    });
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
    const summaryOf = (name: string, state: string) =>
      waitFor(`${name}'s annotation: ${state}`, () => {
        const text = fake.getVmi('default', name)?.metadata.annotations?.[PROVISIONING_ANNOTATION];
        const parsed = text === undefined ? undefined : (JSON.parse(text) as ProvisioningSummary);
        return parsed?.state === state ? { parsed, text: text! } : undefined;
      });

    const init = cabpk('controlplane-init.yaml');
    const cp = fake.applyVmi(vmi('cp', { cloudInit: seededWith(init) }));
    const cpFails = fake.applyVmi(vmi('cp-fails', { cloudInit: seededWith(init) }));
    const worker = fake.applyVmi(vmi('worker', { cloudInit: seededWith(cabpk('node-join-post-commands.yaml')) }));
    for (const n of ['cp', 'cp-fails', 'worker'])
      await waitFor(`seed of ${n}`, async () => (await statusOf(n))?.servedOverHttp);
    const reportUrl = (uid: string | undefined) =>
      `${listener.baseUrl}/${reportToken(ds.keyring, uid!)}/cloud-init-events`;

    // The control plane's boot succeeds: runcmd's last command wrote the sentinel.
    await postAll(reportUrl(cp.metadata.uid), SUCCESS);
    const p = (await statusOf('cp'))!.provisioning!;
    assert.equal(p.state, 'bootstrapped');
    assert.equal(p.sentinel, 'written');
    const { parsed, text } = await summaryOf('cp', 'bootstrapped');
    assert.deepEqual(parsed, {
      v: 1,
      state: 'bootstrapped',
      boot: 1,
      result: 'SUCCESS',
      at: p.finishedAt,
      seconds: Math.round(p.seconds! * 10) / 10,
      sentinel: 'written',
    });
    assert.ok(text.startsWith('{"v":1,'), text);

    // The same bootstrap data whose scripts_user fails (kubeadm init failed).
    await postAll(reportUrl(cpFails.metadata.uid), FAILS);
    const failed = (await summaryOf('cp-fails', 'failed')).parsed;
    assert.equal(failed.v, 1);
    assert.equal(failed.failedStep, 'modules-final/config-scripts-user');
    assert.equal(failed.module, 'scripts_user');
    assert.equal(failed.sentinel, undefined);

    // A join whose postKubeadmCommands follow the sentinel: vmseed cannot tell.
    await postAll(reportUrl(worker.metadata.uid), SUCCESS);
    const joined = (await summaryOf('worker', 'succeeded')).parsed;
    assert.equal(joined.sentinel, 'unverified');
    assert.equal(joined.v, 1);

    // Events: the control plane's says it is bootstrapped.
    const evs = await waitFor('provisioning Events', () => {
      const got = fake.events().filter((e) => e.reason.startsWith('Provisioning'));
      return got.length >= 3 ? got : undefined;
    });
    const of = (name: string) => evs.find((e) => e.involvedObject.name === name)!;
    assert.equal(of('cp').reason, 'ProvisioningSucceeded');
    assert.match(of('cp').message, /\(boot 1\); bootstrapped \(Cluster API sentinel written\)$/);
    assert.equal(of('cp-fails').reason, 'ProvisioningFailed');
    assert.equal(of('worker').reason, 'ProvisioningSucceeded');
    assert.doesNotMatch(of('worker').message, /bootstrapped/);

    // Counts, the gauge and the page.
    assert.deepEqual((await statusJson()).provisioningCounts, {
      running: 0,
      failed: 1,
      succeeded: 1,
      bootstrapped: 1,
      'not-reported': 0,
    });
    const metrics = await (await fetch(`${http.url}/metrics`)).text();
    assert.match(metrics, /^vmseed_provisioning_vmis\{state="bootstrapped"\} 1$/m);
    assert.match(metrics, /^vmseed_provisioning_vmis\{state="succeeded"\} 1$/m);
    const list = await (await fetch(`${http.url}/status`)).text();
    assert.match(list, /data-provisioning="bootstrapped">bootstrapped in /);
    assert.match(list, /<tr data-provisioning="bootstrapped"><th>bootstrapped<\/th><td class="num">1</);
    const page = await (await fetch(`${http.url}/status/default/cp`)).text();
    assert.match(page, /id="provisioning-timeline" data-provisioning="bootstrapped"/);
    assert.match(page, /Cluster API sentinel written/);

    // The user-data stays out of logs, Events and annotations: one word is kept.
    const shown = [
      h.lines.join('\n'),
      JSON.stringify(fake.events()),
      JSON.stringify(
        ['cp', 'cp-fails', 'worker'].map(
          (n) => fake.getVmi('default', n)?.metadata.annotations?.[PROVISIONING_ANNOTATION],
        ),
      ),
    ].join('\n');
    for (const marker of ['kubeadm', 'capi-quickstart', 'abcdef.0123456789abcdef', 'not-a-real-key'])
      assert.ok(!shown.includes(marker), marker);

    // The guest reboots: runcmd's script does not run again and /run is
    // empty, so the new boot proves nothing about the sentinel.
    await postAll(reportUrl(cp.metadata.uid), SUCCESS);
    const rebooted = (await summaryOf('cp', 'succeeded')).parsed;
    assert.equal(rebooted.boot, 2);
    assert.equal(rebooted.sentinel, 'unverified');
  },
);

test('the sentinel is written only by a first boot whose scripts_user (either spelling) succeeded', () => {
  const uid = 'u1';
  const boot = (steps: Array<[string, 'SUCCESS' | 'FAIL']>, prev?: ProvisioningFacts) => {
    let f = prev;
    let ts = 1;
    const post = (name: string, type: 'start' | 'finish', result?: 'SUCCESS' | 'FAIL') =>
      (f = applyEvent(
        f,
        uid,
        { name, type, timestamp: ts++, description: name, ...(result ? { result } : {}) },
        ts,
      ).facts);
    post('modules-final', 'start');
    for (const [step, result] of steps) {
      post(`modules-final/${step}`, 'start');
      post(`modules-final/${step}`, 'finish', result);
    }
    post('modules-final', 'finish', steps.some(([, r]) => r === 'FAIL') ? 'FAIL' : 'SUCCESS');
    return f!;
  };
  const record = (where?: 'last' | 'elsewhere', of = uid): VmiRecord => ({
    key: 'default/cp',
    ...(where ? { bootstrapSentinel: { uid: of, where } } : {}),
  });
  const first22 = boot([['config-scripts-user', 'SUCCESS']]);
  const first25 = boot([['config-scripts_user', 'SUCCESS']]);
  assert.equal(sentinelOf(record('last'), first22), 'written');
  assert.equal(sentinelOf(record('last'), first25), 'written');
  assert.equal(sentinelOf(record('elsewhere'), first25), 'unverified');
  // scripts_user not reported (a partial timeline): cannot tell.
  assert.equal(sentinelOf(record('last'), boot([['config-final-message', 'SUCCESS']])), 'unverified');
  // A reboot: boot 2 of the same object.
  const second = boot([['config-scripts_user', 'SUCCESS']], first25);
  assert.equal(second.boot, 2);
  assert.equal(sentinelOf(record('last'), second), 'unverified');
  // A FAIL, no word about the user-data, or another object's word: nothing.
  assert.equal(sentinelOf(record('last'), boot([['config-scripts_user', 'FAIL']])), undefined);
  assert.equal(sentinelOf(record(), first25), undefined);
  assert.equal(sentinelOf(record('last', 'other-uid'), first25), undefined);
});
