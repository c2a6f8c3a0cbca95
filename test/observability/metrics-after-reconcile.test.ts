// /metrics after REAL reconciles: the in-process agent against the fake API
// server (real renderer, ISO builder, image store; a recording injector),
// scraped over HTTP. `promtool check metrics` must pass, and every series
// must hold exactly the observations the test caused, cross-checked against
// independent witnesses: the images on disk, the injector's calls and the
// Events the fake API server received.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { statSync } from 'node:fs';
import { FakeKube } from '../support/fake-kube.ts';
import { RecordingInjector, startAgent, tempDir, vmi, waitFor } from '../support/agent-harness.ts';
import { histogramBuckets, parseExposition, promtoolCheck, sampleValue, type Sample } from '../support/promtool.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import type { EjectionResult, InjectionResult, InjectionTarget } from '../../src/libvirt/injector-contract.ts';
import { VmseedError } from '../../src/errors.ts';

function count(s: Sample[], name: string, labels: Record<string, string> = {}): number {
  return sampleValue(s, `${name}_count`, labels) ?? 0;
}

// Holds the inject() of one VMI until released, so a reconcile is in flight
// while the test scrapes.
class GatedInjector extends RecordingInjector {
  gatePrefix = '';
  #waiting: Array<() => void> = [];
  entered = 0;

  override async inject(t: InjectionTarget, imagePath: string): Promise<InjectionResult> {
    if (this.gatePrefix && t.name.startsWith(this.gatePrefix)) {
      this.entered++;
      await new Promise<void>((r) => this.#waiting.push(r));
    }
    return super.inject(t, imagePath);
  }

  override async eject(t: InjectionTarget): Promise<EjectionResult> {
    return super.eject(t);
  }

  release(): void {
    this.gatePrefix = '';
    for (const r of this.#waiting.splice(0)) r();
  }
}

test(
  'metrics after real reconciles: promtool passes and every series holds what happened',
  { timeout: 60_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    const injector = new GatedInjector();
    fake.applyVmi(vmi('web-1'));
    fake.applyVmi(vmi('web-2'));
    fake.applyVmi(
      vmi('db-1', { cloudInit: 'datasource: configdrive\nuserData: |\n  #cloud-config\n  hostname: db-1\n' }),
    );
    // Terminal: not base64. ConfigDrive, so the error lands on {configdrive,error}.
    fake.applyVmi(vmi('bad-b64', { cloudInit: 'datasource: configdrive\nuserDataBase64: "not base64 at all!"\n' }));
    // Retryable until its Secret appears.
    const late = fake.applyVmi(vmi('late-secret', { cloudInit: 'secretRef: {name: late-ud}\n' }));

    // Witness of every reconcile's result, taken where the work queue calls
    // the reconciler, outside the code that counts them in the metrics.
    const results: Array<{ key: string; result: string }> = [];
    const h = await startAgent(fake, {
      stateDir: dir.path,
      injector,
      beforeStart: async (agent) => {
        const reconcile = agent.reconciler.reconcile.bind(agent.reconciler);
        agent.reconciler.reconcile = async (key) => {
          const r = await reconcile(key);
          results.push({ key, result: typeof r === 'string' ? r : 'terminal' });
          return r;
        };
      },
    });
    const witnessed = (key: string, result: string) =>
      results.filter((x) => x.key === key && x.result === result).length;
    const srv = await startHttpServer({
      listen: '127.0.0.1:0',
      metrics: h.metrics,
      status: h.agent.status,
      logger: h.logger,
    });
    t.after(async () => {
      injector.release();
      await srv.close();
      await h.stop();
      await fake.close();
      await dir.remove();
    });
    const scrape = async () => {
      const res = await fetch(`${srv.url}/metrics`);
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
      return res.text();
    };

    // The missing Secret fails a few times with backoff, then appears.
    await waitFor(
      'SECRET_NOT_FOUND retried',
      () => h.lines.filter((l) => l.includes('"code":"SECRET_NOT_FOUND"')).length >= 2,
      20_000,
    );
    fake.setSecret({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'late-ud', namespace: 'default' },
      data: { userdata: Buffer.from('#cloud-config\nhostname: late\n').toString('base64') },
    });
    await waitFor(
      'four seeds ready',
      () =>
        h.agent.status.snapshot().vmis.filter((v) => v.state === 'ready').length === 4 &&
        h.agent.status.get('default/bad-b64')?.state === 'error',
      15_000,
    );
    await h.agent.queue.idle();
    await h.agent.events.flush();

    const text = await scrape();
    const check = await promtoolCheck(text);
    assert.ok(check.ok, `promtool check metrics: exit ${check.code}\n${check.output}`);
    const s = parseExposition(text);
    const snap0 = h.agent.status.snapshot();
    const Q = { name: 'vmi' };

    // Witnesses: the failures of late-secret as the Events API saw them.
    const failed = fake.events().find((e) => e.reason === 'SeedFailed' && e.involvedObject.uid === late.metadata.uid);
    assert.ok(failed, 'SeedFailed Event for late-secret');
    const n = failed.count; // identical failures are counted on one Event
    assert.ok(n >= 2);
    assert.match(failed.message, /^SECRET_NOT_FOUND: /);

    // Reconciles: 4 successes, 1 terminal, n retryable errors. The Secret's
    // change can land while a reconcile of late-secret is running and reads
    // it: that reconcile succeeds and the change runs the key once more (an
    // unchanged success), so late-secret succeeds once or twice.
    for (const key of ['default/web-1', 'default/web-2', 'default/db-1'])
      assert.equal(witnessed(key, 'success'), 1, key);
    const lateSuccesses = witnessed('default/late-secret', 'success');
    assert.ok(lateSuccesses === 1 || lateSuccesses === 2, `late-secret succeeded ${lateSuccesses} times`);
    assert.equal(witnessed('default/late-secret', 'retry'), n);
    assert.equal(witnessed('default/bad-b64', 'terminal'), 1);
    assert.equal(results.length, 3 + lateSuccesses + n + 1, JSON.stringify(results));
    assert.equal(sampleValue(s, 'vmseed_reconcile_total', { result: 'success' }), 3 + lateSuccesses);
    assert.equal(sampleValue(s, 'vmseed_reconcile_total', { result: 'terminal' }), 1);
    assert.equal(sampleValue(s, 'vmseed_reconcile_total', { result: 'error' }), n);
    assert.equal(sampleValue(s, 'vmseed_reconcile_errors_total', { code: 'SECRET_NOT_FOUND' }), n);
    assert.equal(sampleValue(s, 'vmseed_reconcile_errors_total', { code: 'USERDATA_BASE64_INVALID' }), 1);
    assert.equal(s.filter((x) => x.name === 'vmseed_reconcile_errors_total').length, 2, 'no other error codes');

    // Seed generation by datasource and result; the image build only for rendered seeds.
    assert.equal(count(s, 'vmseed_seed_generation_duration_seconds', { datasource: 'nocloud', result: 'success' }), 3);
    assert.equal(
      count(s, 'vmseed_seed_generation_duration_seconds', { datasource: 'configdrive', result: 'success' }),
      1,
    );
    assert.equal(count(s, 'vmseed_seed_generation_duration_seconds', { datasource: 'nocloud', result: 'error' }), n);
    assert.equal(
      count(s, 'vmseed_seed_generation_duration_seconds', { datasource: 'configdrive', result: 'error' }),
      1,
    );
    // Every render builds its image; only a new one is written (and counted
    // as a generation): late-secret's second success built the same bytes.
    assert.equal(count(s, 'vmseed_image_build_duration_seconds', { datasource: 'nocloud' }), 2 + lateSuccesses);
    assert.equal(count(s, 'vmseed_image_build_duration_seconds', { datasource: 'configdrive' }), 1);
    // Buckets are cumulative and end with the count; sub-millisecond work has
    // buckets fine enough to land in (from 50 µs).
    const b = histogramBuckets(s, 'vmseed_image_build_duration_seconds', { datasource: 'nocloud' });
    assert.equal(b.get(Infinity), 2 + lateSuccesses);
    assert.equal([...b.keys()][0], 0.00005);
    const values = [...b.values()];
    assert.deepEqual(
      values,
      [...values].sort((x, y) => x - y),
    );

    // Image sizes: one observation per written image, summing to the files on disk.
    const snap = h.agent.status.snapshot();
    const ready = snap.vmis.filter((v) => v.state === 'ready');
    const onDisk = (ds: string) =>
      ready.filter((v) => v.datasource === ds).reduce((a, v) => a + statSync(v.imagePath!).size, 0);
    assert.equal(count(s, 'vmseed_image_bytes', { datasource: 'nocloud' }), 3);
    assert.equal(count(s, 'vmseed_image_bytes', { datasource: 'configdrive' }), 1);
    assert.equal(sampleValue(s, 'vmseed_image_bytes_sum', { datasource: 'nocloud' }), onDisk('nocloud'));
    assert.equal(sampleValue(s, 'vmseed_image_bytes_sum', { datasource: 'configdrive' }), onDisk('configdrive'));
    assert.equal(
      histogramBuckets(s, 'vmseed_image_bytes', { datasource: 'nocloud' }).get(4096),
      0,
      'an ISO is never below 4 KiB',
    );

    // Injection: one attach per ready VMI, as the injector saw.
    assert.equal(injector.actions('inject', 'attached').length, 4);
    assert.equal(count(s, 'vmseed_injection_duration_seconds', { operation: 'attach', result: 'success' }), 4);
    assert.equal(count(s, 'vmseed_seed_ready_latency_seconds'), 4);

    // Gauges.
    assert.deepEqual(
      Object.fromEntries(s.filter((x) => x.name === 'vmseed_vmis').map((x) => [x.labels.state, x.value])),
      { pending: 0, ready: 4, warning: 0, error: 1, skipped: 0 },
    );
    assert.equal(sampleValue(s, 'vmseed_informer_synced'), 1);
    // Bounded label sets are there at 0 before anything happened to them.
    for (const reason of ['error', 'stale', 'gone'])
      assert.equal(sampleValue(s, 'vmseed_informer_restarts_total', { reason }), 0, reason);
    // client-go's work-queue series, for the one queue named vmi.
    assert.equal(sampleValue(s, 'workqueue_depth', Q), 0);
    assert.equal(sampleValue(s, 'vmseed_workqueue_in_flight'), 0);
    assert.equal(sampleValue(s, 'workqueue_longest_running_processor_seconds', Q), 0);
    assert.equal(sampleValue(s, 'workqueue_unfinished_work_seconds', Q), 0);
    assert.equal(sampleValue(s, 'workqueue_retries_total', Q), n);
    assert.equal(count(s, 'workqueue_work_duration_seconds', Q), results.length);
    assert.equal(count(s, 'workqueue_queue_duration_seconds', Q), results.length);
    assert.equal(sampleValue(s, 'workqueue_adds_total', Q), results.length);
    assert.equal(sampleValue(s, 'vmseed_build_info', { version: 'test', nodejs_version: process.version }), 1);
    // Per-VMI labels only on the per-VMI series: one of each per VMI held,
    // with its state and code.
    const perVmi = new Set(['vmseed_vmi_info', 'vmseed_vmi_state_since_timestamp_seconds']);
    for (const x of s)
      if (!perVmi.has(x.name) && !x.name.startsWith('workqueue_'))
        assert.ok(!('namespace' in x.labels) && !('name' in x.labels), `${x.name} has a per-VMI label`);
    const info = s.filter((x) => x.name === 'vmseed_vmi_info');
    assert.equal(info.length, snap0.vmis.length);
    for (const v of snap0.vmis) {
      const code = v.lastError?.code ?? v.warnings[0]?.code ?? '';
      const labels = { namespace: v.namespace, name: v.name, state: v.state, code };
      assert.equal(sampleValue(s, 'vmseed_vmi_info', labels), 1, JSON.stringify(labels));
      assert.equal(
        sampleValue(s, 'vmseed_vmi_state_since_timestamp_seconds', labels),
        Date.parse(v.stateSince!) / 1000,
      );
    }
    assert.equal(
      sampleValue(s, 'vmseed_vmi_info', {
        namespace: 'default',
        name: 'bad-b64',
        state: 'error',
        code: 'USERDATA_BASE64_INVALID',
      }),
      1,
    );

    // Seconds since the last watch event is measured at scrape time (not
    // whenever the watchdog last ran): quiet for a while, it shows.
    // Bounds from this test's own clock, however late the bookmark's
    // delivery or the scrape: the age is at least the time slept since the
    // bookmark was seen and at most the time since it was sent.
    const sentAt = Date.now();
    fake.bookmark();
    await waitFor('the bookmark seen', () => Date.parse(h.agent.source.status().lastEventAt ?? '') >= sentAt);
    await new Promise((r) => setTimeout(r, 1200));
    const quiet = sampleValue(parseExposition(await scrape()), 'vmseed_informer_last_event_age_seconds')!;
    const sinceSent = (Date.now() - sentAt) / 1000;
    assert.ok(
      quiet >= 1.2 && quiet <= sinceSent,
      `age ${quiet} s after 1.2 s without events, ${sinceSent} s after the bookmark`,
    );

    // A reconcile in flight: depth, in-flight and the longest running one.
    // Six slow ones against a concurrency of 4: four in flight, two waiting.
    injector.gatePrefix = 'slow';
    const appliedAt = performance.now();
    for (let i = 0; i < 6; i++) fake.applyVmi(vmi(`slow-${i}`));
    await waitFor('four reconciles in inject()', () => injector.entered === 4, 20_000);
    await new Promise((r) => setTimeout(r, 400));
    const busy = parseExposition(await scrape());
    assert.equal(sampleValue(busy, 'vmseed_workqueue_in_flight'), 4);
    assert.equal(sampleValue(busy, 'workqueue_depth', Q), 2);
    assert.equal(sampleValue(busy, 'vmseed_vmis', { state: 'pending' }), 6);
    const longest = sampleValue(busy, 'workqueue_longest_running_processor_seconds', Q)!;
    const unfinished = sampleValue(busy, 'workqueue_unfinished_work_seconds', Q)!;
    assert.ok(unfinished >= 4 * 0.4 && unfinished <= 4 * longest + 0.01, `unfinished work: ${unfinished}`);
    assert.ok(
      longest >= 0.4 && longest <= (performance.now() - appliedAt) / 1000 + 0.01,
      `longest running: ${longest}`,
    );
    injector.release();
    await waitFor(
      'slow ones ready',
      () =>
        h.agent.status.snapshot().vmis.filter((v) => v.name.startsWith('slow-') && v.state === 'ready').length === 6,
      20_000,
    );
    await h.agent.queue.idle();

    // A deleted VMI: detached, image removed, gauges follow.
    fake.deleteVmi('default', 'web-2');
    await waitFor('web-2 gone', () => h.agent.status.get('default/web-2') === undefined, 20_000);
    await h.agent.queue.idle();
    const after = parseExposition(await scrape());
    assert.equal(count(after, 'vmseed_injection_duration_seconds', { operation: 'detach', result: 'success' }), 1);
    assert.equal(injector.actions('eject', 'detached').length, 1);
    assert.equal(sampleValue(after, 'vmseed_vmis', { state: 'ready' }), 9);
    assert.equal(sampleValue(after, 'workqueue_depth', Q), 0);
    assert.equal(sampleValue(after, 'workqueue_longest_running_processor_seconds', Q), 0);
    assert.equal(
      after.filter((x) => x.name === 'vmseed_vmi_info' && x.labels.name === 'web-2').length,
      0,
      'a deleted VMI leaves the per-VMI series',
    );
    // Six slow ones and web-2's deletion since the first scrape.
    const successes = results.filter((x) => x.result === 'success').length;
    assert.equal(successes, 3 + lateSuccesses + 6 + 1);
    assert.equal(sampleValue(after, 'vmseed_reconcile_total', { result: 'success' }), successes);
    assert.equal(count(after, 'vmseed_seed_ready_latency_seconds'), 10);
    const final = await promtoolCheck(await scrape());
    assert.ok(final.ok, final.output);
  },
);

test(
  'seed-ready latency counts from first sight; informer_synced 0 while the API server is away, 1 when it is back',
  { timeout: 30_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    // Created two hours before this agent first saw it: the latency a VM
    // owner feels is counted from first sight, not from creation.
    const old = vmi('one');
    old.metadata.creationTimestamp = new Date(Date.now() - 2 * 3600_000).toISOString();
    fake.applyVmi(old);
    const h = await startAgent(fake, { stateDir: dir.path });
    const srv = await startHttpServer({
      listen: '127.0.0.1:0',
      metrics: h.metrics,
      status: h.agent.status,
      logger: h.logger,
    });
    t.after(async () => {
      await srv.close();
      await h.stop();
      await fake.close();
      await dir.remove();
    });
    const synced = async () =>
      sampleValue(parseExposition(await (await fetch(`${srv.url}/metrics`)).text()), 'vmseed_informer_synced');
    assert.equal(await synced(), 1);
    await waitFor('one ready', () => h.agent.status.get('default/one')?.state === 'ready', 20_000);
    const first = parseExposition(await (await fetch(`${srv.url}/metrics`)).text());
    assert.equal(count(first, 'vmseed_seed_ready_latency_seconds'), 1);
    assert.ok(sampleValue(first, 'vmseed_seed_ready_latency_seconds_sum')! < 10, 'counted from first sight');
    await fake.refuse(true);
    await waitFor('synced 0', async () => (await synced()) === 0, 20_000);
    await fake.refuse(false);
    await waitFor('synced 1', async () => (await synced()) === 1, 20_000);
    const s = parseExposition(await (await fetch(`${srv.url}/metrics`)).text());
    assert.ok((sampleValue(s, 'vmseed_informer_restarts_total', { reason: 'error' }) ?? 0) >= 1);
  },
);

// libvirt refuses one domain: the image was generated (one success
// observation, not also an error one), the injection failed (attach, then
// replace once the domain had our disk), the reconcile error has its code.
class RefusingInjector extends RecordingInjector {
  refuse = new Set<string>();

  override async inject(t: InjectionTarget, imagePath: string): Promise<InjectionResult> {
    if (this.refuse.has(t.name))
      throw new VmseedError(
        'DOMAIN_STATE_UNSUPPORTED',
        `domain ${t.namespace}_${t.name} is in a state vmseed cannot attach to; wait for it to settle`,
        { kind: 'terminal' },
      );
    return super.inject(t, imagePath);
  }
}

test('injection failures: counted as injection errors, not as failed generations', { timeout: 30_000 }, async (t) => {
  const fake = await FakeKube.start();
  const dir = await tempDir();
  const injector = new RefusingInjector();
  injector.refuse.add('stuck');
  fake.applyVmi(vmi('stuck'));
  fake.applyVmi(vmi('fine'));
  const h = await startAgent(fake, { stateDir: dir.path, injector });
  const srv = await startHttpServer({
    listen: '127.0.0.1:0',
    metrics: h.metrics,
    status: h.agent.status,
    logger: h.logger,
  });
  t.after(async () => {
    await srv.close();
    await h.stop();
    await fake.close();
    await dir.remove();
  });
  const scrape = async () => parseExposition(await (await fetch(`${srv.url}/metrics`)).text());
  await waitFor(
    'settled',
    () =>
      h.agent.status.get('default/stuck')?.state === 'error' && h.agent.status.get('default/fine')?.state === 'ready',
    20_000,
  );
  await h.agent.queue.idle();
  let s = await scrape();
  assert.equal(count(s, 'vmseed_seed_generation_duration_seconds', { datasource: 'nocloud', result: 'success' }), 2);
  assert.equal(count(s, 'vmseed_seed_generation_duration_seconds', { datasource: 'nocloud', result: 'error' }), 0);
  assert.equal(count(s, 'vmseed_injection_duration_seconds', { operation: 'attach', result: 'error' }), 1);
  assert.equal(count(s, 'vmseed_injection_duration_seconds', { operation: 'attach', result: 'success' }), 1);
  assert.equal(sampleValue(s, 'vmseed_reconcile_errors_total', { code: 'DOMAIN_STATE_UNSUPPORTED' }), 1);
  assert.equal(sampleValue(s, 'vmseed_reconcile_total', { result: 'terminal' }), 1);

  // fine's domain has our disk; the next change is a replace, and it fails.
  injector.refuse.add('fine');
  const cur = fake.getVmi('default', 'fine')!;
  fake.applyVmi({
    ...cur,
    metadata: {
      ...cur.metadata,
      annotations: { 'vmseed.io/cloud-init': 'userData: |\n  #cloud-config\n  hostname: changed\n' },
    },
  });
  await waitFor('fine in error', () => h.agent.status.get('default/fine')?.state === 'error', 20_000);
  await h.agent.queue.idle();
  s = await scrape();
  assert.equal(count(s, 'vmseed_injection_duration_seconds', { operation: 'replace', result: 'error' }), 1);
  assert.equal(count(s, 'vmseed_seed_generation_duration_seconds', { datasource: 'nocloud', result: 'success' }), 3);
  assert.equal(count(s, 'vmseed_seed_generation_duration_seconds', { datasource: 'nocloud', result: 'error' }), 0);
  const check = await promtoolCheck(await (await fetch(`${srv.url}/metrics`)).text());
  assert.ok(check.ok, check.output);
});
