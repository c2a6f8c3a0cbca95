import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import { FakeStatusSource } from '../support/fake-status.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { histogramBuckets, parseExposition, promtoolCheck, sampleValue } from '../support/promtool.ts';

test('promtool check metrics passes on a live /metrics scrape that holds the observations made', async () => {
  const metrics = createMetrics({ version: '0.1.0-test' }); // with process metrics, as in production
  // Observations through the metric objects, as the agent makes them.
  metrics.seedGenerationDuration.observe({ datasource: 'nocloud', result: 'success' }, 0.00007);
  metrics.seedGenerationDuration.observe({ datasource: 'nocloud', result: 'success' }, 0.003);
  metrics.seedGenerationDuration.observe({ datasource: 'nocloud', result: 'success' }, 0.2);
  metrics.seedGenerationDuration.observe({ datasource: 'configdrive', result: 'error' }, 0.0004);
  metrics.imageBuildDuration.observe({ datasource: 'nocloud' }, 0.00012);
  metrics.injectionDuration.observe({ operation: 'attach', result: 'success' }, 0.04);
  metrics.injectionDuration.observe({ operation: 'detach', result: 'error' }, 7);
  metrics.seedReadyLatency.observe(2.2);
  metrics.reconcileTotal.inc({ result: 'success' }, 3);
  metrics.reconcileTotal.inc({ result: 'error' });
  metrics.reconcileErrors.inc({ code: 'SECRET_NOT_FOUND' });
  metrics.queueDepth.set(2);
  metrics.queueWorkDuration.observe(0.0035);
  metrics.queueRetries.inc();
  metrics.informerRestarts.inc({ reason: 'stale' });
  metrics.informerSynced.set(1);
  metrics.vmis.set({ state: 'ready' }, 4);
  metrics.vmis.set({ state: 'error' }, 1);
  metrics.imageBytes.observe({ datasource: 'nocloud' }, 36864);

  const { logger } = captureLogger('warn');
  const srv = await startHttpServer({ listen: '127.0.0.1:0', metrics, status: new FakeStatusSource(), logger });
  try {
    const res = await fetch(`${srv.url}/metrics`);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), metrics.registry.contentType);
    const text = await res.text();

    const check = await promtoolCheck(text);
    assert.equal(check.ok, true, `promtool check metrics (exit ${check.code}):\n${check.output}`);
    // promtool must actually reject something, or the check above proves nothing.
    const lint = await promtoolCheck('# HELP x t\n# TYPE x counter\nx 1\n');
    assert.equal(lint.ok, false, lint.output);
    assert.match(lint.output, /should have "_total" suffix/);
    const syntax = await promtoolCheck('x{a=1} 1\n');
    assert.equal(syntax.ok, false, syntax.output);

    const s = parseExposition(text);
    const gen = { datasource: 'nocloud', result: 'success' };
    assert.equal(sampleValue(s, 'vmseed_seed_generation_duration_seconds_count', gen), 3);
    assert.ok(Math.abs(sampleValue(s, 'vmseed_seed_generation_duration_seconds_sum', gen)! - 0.20307) < 1e-9);
    const b = histogramBuckets(s, 'vmseed_seed_generation_duration_seconds', gen);
    assert.equal(b.get(5e-5), 0);
    assert.equal(b.get(0.0001), 1, '70 µs lands in the 100 µs bucket');
    assert.equal(b.get(0.0025), 1);
    assert.equal(b.get(0.005), 2);
    assert.equal(b.get(0.1), 2);
    assert.equal(b.get(0.25), 3);
    assert.equal(b.get(Infinity), 3);
    assert.equal(
      sampleValue(s, 'vmseed_seed_generation_duration_seconds_count', { datasource: 'configdrive', result: 'error' }),
      1,
    );
    assert.equal(histogramBuckets(s, 'vmseed_image_build_duration_seconds', { datasource: 'nocloud' }).get(0.00025), 1);
    assert.equal(
      histogramBuckets(s, 'vmseed_injection_duration_seconds', { operation: 'detach', result: 'error' }).get(5),
      0,
    );
    assert.equal(
      histogramBuckets(s, 'vmseed_injection_duration_seconds', { operation: 'detach', result: 'error' }).get(10),
      1,
    );
    assert.equal(sampleValue(s, 'vmseed_seed_ready_latency_seconds_count'), 1);
    assert.equal(sampleValue(s, 'vmseed_reconcile_total', { result: 'success' }), 3);
    assert.equal(sampleValue(s, 'vmseed_reconcile_errors_total', { code: 'SECRET_NOT_FOUND' }), 1);
    assert.equal(sampleValue(s, 'vmseed_vmis', { state: 'error' }), 1);
    assert.equal(sampleValue(s, 'vmseed_informer_restarts_total', { reason: 'stale' }), 1);
    assert.equal(histogramBuckets(s, 'vmseed_image_bytes', { datasource: 'nocloud' }).get(65536), 1);
    assert.equal(sampleValue(s, 'vmseed_build_info', { version: '0.1.0-test', nodejs_version: process.version }), 1);
    assert.ok(sampleValue(s, 'vmseed_process_resident_memory_bytes')! > 0, 'default process metrics are there');
  } finally {
    await srv.close();
  }
});
