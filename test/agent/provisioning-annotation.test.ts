// What someone with only kubectl sees: the agent keeps each VMI's
// provisioning summary in its annotation vmseed.io/provisioning, through the
// fake API server. A guest that read its seed disk while the seed asks for
// no reports (the datasource is off) shows as not-reported, with why. An
// install whose RBAC lacks `patch` on VMIs still seeds every VMI; the agent
// stays ready and says degraded (/readyz, the status page, status.json)
// until the grant comes, then writes the summary; /metrics counts each write
// by its result.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeKubeAndDir, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { AttachingInjector, FakeClient } from '../support/seed-read-doubles.ts';
import { loadManifestObjects, manifestRbacWithout } from '../support/kube-authz.ts';
import { ROOT } from '../support/manifests.ts';
import { progressReportPlanner } from '../../src/agent/provisioning/report-plan.ts';
import { PROVISIONING_ANNOTATION, type ProvisioningSummary } from '../../src/agent/provisioning/summary.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import { configSummary, loadConfig } from '../../src/config/config.ts';

test(
  'agent: seed read, no reports asked: not-reported on the VMI; without RBAC for it the agent seeds on, ready but degraded',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    fake.setRbac(manifestRbacWithout('virtualmachineinstances', 'patch'));
    const client = new FakeClient();
    client.reads = 1;
    const h = await startAgent(fake, {
      stateDir: dir.path,
      injector: new AttachingInjector(),
      seedReads: client,
      seedReadPolicy: { firstMs: 5, maxMs: 40, boundMs: 60_000, timeoutMs: 1000 },
      reportPlan: progressReportPlanner({ enabled: true }),
      annotateVmis: { minIntervalMs: 50, sweepMs: 50, forbiddenRetryMs: 100 },
    });
    const http = await startHttpServer({
      listen: '127.0.0.1:0',
      metrics: h.metrics,
      status: h.agent.status,
      logger: h.logger,
    });
    t.after(async () => {
      await http.close();
      await h.stop();
    });

    fake.applyVmi(vmi('vm', { userData: 'marker-in-user-data' }));
    const read = await waitFor('seeded and read', () => {
      const s = h.agent.status.get('default/vm');
      return s?.state === 'ready' && s.firstBoot?.watch === 'read' ? s : undefined;
    });
    await waitFor('a refused patch', () =>
      fake.requests.some((r) => r.resource === 'virtualmachineinstances' && r.verb === 'patch' && r.status === 403),
    );

    // Ready, degraded, with the reason, wherever readiness shows.
    const readiness = await h.agent.status.readiness();
    assert.equal(readiness.ready, true);
    assert.match(readiness.degraded?.[0] ?? '', /vmseed\.io\/provisioning cannot be written: 403 Forbidden/);
    const readyz = await fetch(`${http.url}/readyz`);
    assert.equal(readyz.status, 200);
    assert.match(
      await readyz.text(),
      /^ok \(degraded\)\n- the VMI annotation vmseed\.io\/provisioning cannot be written: 403/,
    );
    const page = await (await fetch(`${http.url}/status`)).text();
    assert.match(page, /id="readiness" data-degraded="true"><h2>Degraded/);
    assert.match(page, /--provisioning-annotation=false/);
    const json = (await (await fetch(`${http.url}/status.json`)).json()) as { readiness: { degraded?: string[] } };
    assert.match(json.readiness.degraded?.[0] ?? '', /403 Forbidden/);
    assert.equal(fake.getVmi('default', 'vm')?.metadata.annotations?.[PROVISIONING_ANNOTATION], undefined);

    // The grant comes: the summary lands, the agent is no longer degraded.
    fake.setRbac(loadManifestObjects(`${ROOT}manifests/daemonset.yaml`));
    const value = await waitFor(
      'the annotation',
      () => fake.getVmi('default', 'vm')?.metadata.annotations?.[PROVISIONING_ANNOTATION],
    );
    const summary = JSON.parse(value) as ProvisioningSummary;
    assert.equal(summary.state, 'not-reported');
    assert.equal(summary.at, read.firstBoot!.seedReadAt);
    assert.match(summary.reason ?? '', /the NoCloud HTTP datasource is off/);
    assert.doesNotMatch(value, /marker-in-user-data|cloud-config/);
    assert.equal((await h.agent.status.readiness()).degraded, undefined);
    assert.equal(await (await fetch(`${http.url}/readyz`)).text(), 'ok\n');
    // Written once: the summary has not changed since.
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(
      fake.requests.filter((r) => r.resource === 'virtualmachineinstances' && r.verb === 'patch' && r.status === 200)
        .length,
      1,
    );
    // Each write counted by its result, on the agent's /metrics.
    const scraped = await (await fetch(`${http.url}/metrics`)).text();
    const writes = (result: string) =>
      Number(new RegExp(`^vmseed_vmi_annotation_writes_total\\{result="${result}"\\} (\\d+)$`, 'm').exec(scraped)?.[1]);
    const patchStatuses = fake.requests
      .filter((r) => r.resource === 'virtualmachineinstances' && r.verb === 'patch')
      .map((r) => r.status);
    assert.equal(writes('success'), 1);
    assert.equal(writes('forbidden'), patchStatuses.filter((s) => s === 403).length);
    assert.ok(writes('forbidden') >= 1);
    assert.equal(writes('error'), 0);
  },
);

test('--provisioning-annotation: on in a cluster unless false, in the config summary; not a local-mode setting', () => {
  const cluster = (args: string[], env: NodeJS.ProcessEnv = {}) => loadConfig(args, { NODE_NAME: 'n1', ...env }, '/')!;
  assert.equal(cluster([]).provisioningAnnotation, true);
  assert.equal(configSummary(cluster([])).provisioningAnnotation, true);
  assert.equal(cluster(['--provisioning-annotation', 'false']).provisioningAnnotation, false);
  assert.equal(cluster([], { VMSEED_PROVISIONING_ANNOTATION: 'false' }).provisioningAnnotation, false);
  assert.throws(() => cluster(['--provisioning-annotation', 'off']), /--provisioning-annotation/);
  assert.equal(configSummary(loadConfig(['--local', 'examples'], {}, '/')!).provisioningAnnotation, undefined);
});
