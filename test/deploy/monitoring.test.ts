import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import * as yaml from 'js-yaml';
import { ROOT, loadYamlDocuments } from '../support/manifests.ts';
import {
  concreteGrafanaQuery,
  exportedMetricNames,
  metricNamesInExpr,
  promtoolCheckRules,
  type RuleGroupFile,
} from '../support/promql.ts';

const run = promisify(execFile);

// Prometheus writes `up` for every target itself; it is the only other name
// the rules may use.
const PROMETHEUS_SYNTHETIC = new Set(['up']);

interface Rule {
  alert?: string;
  record?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

function ruleGroups(): RuleGroupFile {
  const [rule] = loadYamlDocuments('manifests/monitoring/prometheusrule.yaml') as unknown as { spec: RuleGroupFile }[];
  return rule.spec;
}
const alerts = ruleGroups().groups.flatMap((g) => g.rules) as unknown as Rule[];

interface Panel {
  id: number;
  type: string;
  title: string;
  targets?: { expr: string; refId: string }[];
}
const dashboard = JSON.parse(readFileSync(ROOT + 'manifests/monitoring/grafana-dashboard.json', 'utf8')) as {
  panels: Panel[];
  templating: { list: { name: string; type: string; query: unknown }[] };
};
const dashboardQueries = dashboard.panels.flatMap((p) =>
  (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr })),
);
const variableQueries = dashboard.templating.list
  .filter((v) => v.type === 'query')
  .map((v) => {
    const q = typeof v.query === 'string' ? v.query : (v.query as { query: string }).query;
    // label_values(<series selector>, <label>): the selector is the PromQL part.
    const m = /^label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)$/s.exec(q);
    assert.ok(m, `variable ${v.name}: unsupported query ${q}`);
    return { panel: `variable ${v.name}`, expr: m[1] };
  });

test('the metric-name extractor sees through functions, matchers, label lists and variables', () => {
  assert.deepEqual(
    metricNamesInExpr(
      'histogram_quantile(0.99, sum by (node, le) (rate(a_bucket{job="x", le=~"1|2"}[$__rate_interval]))) > 30',
    ),
    ['a_bucket'],
  );
  assert.deepEqual(metricNamesInExpr('sum without (code) (b_total) / on(node) group_left c and up == bool 1'), [
    'b_total',
    'c',
    'up',
  ]);
  assert.deepEqual(metricNamesInExpr('max by (node) (d{x="rate(e)"}) offset 5m'), ['d']);
});

test('alert expressions read only metrics the agent exports', async () => {
  const exported = await exportedMetricNames({ processMetrics: true });
  for (const rule of alerts) {
    const names = metricNamesInExpr(rule.expr);
    assert.ok(names.length > 0, `${rule.alert}: reads no metric`);
    for (const name of names) {
      assert.ok(
        exported.has(name) || PROMETHEUS_SYNTHETIC.has(name),
        `${rule.alert}: ${name} is not exported by src/metrics/metrics.ts`,
      );
    }
  }
});

test('the alerts cover seed failures, the informer, seed-ready latency and injection errors', async () => {
  const exported = await exportedMetricNames({ processMetrics: false });
  const reads = (metric: string) =>
    alerts.filter((a) => metricNamesInExpr(a.expr).some((n) => n.startsWith(metric))).map((a) => a.alert);
  assert.ok(reads('vmseed_reconcile_total').length > 0);
  assert.ok(reads('vmseed_informer_synced').length > 0);
  assert.ok(reads('vmseed_informer_last_event_age_seconds').length > 0);
  assert.ok(reads('vmseed_seed_ready_latency_seconds').length > 0);
  assert.ok(reads('vmseed_injection_duration_seconds').length > 0);
  // Grouping labels an alert uses exist on the metric (plus the target labels).
  for (const rule of alerts) {
    for (const m of rule.expr.matchAll(/by \(([^)]*)\)/g)) {
      for (const label of m[1].split(',').map((s) => s.trim())) {
        if (['node', 'le', 'job', 'instance'].includes(label)) continue;
        const metrics = metricNamesInExpr(rule.expr).filter((n) => exported.has(n));
        assert.ok(
          metrics.some((n) => exported.get(n)!.labels.includes(label)),
          `${rule.alert}: no metric has label ${label}`,
        );
      }
    }
  }
});

test('every alert has a severity, summary, description and a runbook section in docs/operations.md', () => {
  const docs = readFileSync(ROOT + 'docs/operations.md', 'utf8');
  const anchors = new Set(
    [...docs.matchAll(/^#{1,6} (.+)$/gm)].map((m) =>
      m[1]
        .trim()
        .toLowerCase()
        .replace(/[^a-z0-9 _-]/g, '')
        .replace(/ /g, '-'),
    ),
  );
  assert.ok(alerts.length >= 5);
  for (const rule of alerts) {
    assert.ok(rule.alert, 'alerting rules only');
    assert.match(rule.labels?.severity ?? '', /^(critical|warning|info)$/, rule.alert);
    assert.ok(rule.annotations?.summary, `${rule.alert}: summary`);
    assert.ok((rule.annotations?.description ?? '').length > 40, `${rule.alert}: description`);
    const url = rule.annotations?.runbook_url ?? '';
    const [file, anchor] = url.split('#');
    assert.equal(file, 'docs/operations.md', rule.alert);
    assert.equal(anchor, `alert-${rule.alert.toLowerCase()}`);
    assert.ok(anchors.has(anchor), `${rule.alert}: docs/operations.md has no section #${anchor}`);
  }
});

test('promtool check rules accepts the PrometheusRule groups', async () => {
  const out = await promtoolCheckRules(ruleGroups());
  assert.match(out, new RegExp(`SUCCESS: ${alerts.length} rules found`));
});

test('promtool check rules rejects a broken expression (the check is real)', async () => {
  const broken = structuredClone(ruleGroups());
  broken.groups[0].rules[0].expr = 'sum by (node (rate(vmseed_reconcile_total[5m]))';
  await assert.rejects(promtoolCheckRules(broken), (e: { stdout?: string; stderr?: string }) =>
    /FAILED|parse error|unclosed/i.test(`${e.stdout}${e.stderr}`),
  );
});

test('dashboard queries read only exported metrics', async () => {
  const exported = await exportedMetricNames({ processMetrics: true });
  assert.ok(dashboardQueries.length >= 15);
  for (const { panel, expr } of [...dashboardQueries, ...variableQueries]) {
    const names = metricNamesInExpr(expr);
    assert.ok(names.length > 0, `${panel}: reads no metric`);
    for (const name of names)
      assert.ok(exported.has(name), `${panel}: ${name} is not exported by src/metrics/metrics.ts`);
  }
});

test('dashboard queries parse (promtool, as recording rules) and the layout is sound', async () => {
  const rules = [...dashboardQueries, ...variableQueries].map((q, i) => ({
    record: `vmseed:dashboard_query_${i}`,
    expr: concreteGrafanaQuery(q.expr),
  }));
  const out = await promtoolCheckRules({ groups: [{ name: 'dashboard', rules }] });
  assert.match(out, new RegExp(`SUCCESS: ${rules.length} rules found`));
  const ids = dashboard.panels.map((p) => p.id);
  assert.equal(new Set(ids).size, ids.length, 'panel ids are unique');
  const exported = await exportedMetricNames({ processMetrics: false });
  const charted = new Set(
    dashboardQueries.flatMap((q) => metricNamesInExpr(q.expr)).map((n) => n.replace(/_(bucket|sum|count)$/, '')),
  );
  for (const [name, info] of exported) {
    if (/_(bucket|sum|count)$/.test(name) && info.type === 'histogram') continue;
    assert.ok(charted.has(name), `${name} has no panel`);
  }
});

// The alerts fire on the series that mean trouble and not before their
// `for`: promtool's rule unit tests on synthetic series. Annotations are
// stripped here (their templates render $value; their presence and syntax
// are checked above), the expressions, `for` and labels are the shipped ones.
test('promtool test rules: the alerts fire when they should and not before', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-alerts-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const stripped = structuredClone(ruleGroups());
  for (const g of stripped.groups) for (const r of g.rules) delete r.annotations;
  writeFileSync(join(dir, 'rules.yaml'), yaml.dump(stripped));
  const s = 'job="vmseed", node="n1", instance="10.0.0.1:8080"';
  const firing = (severity: string, extra: Record<string, string> = {}) => [
    { exp_labels: { severity, node: 'n1', ...extra } },
  ];
  const unitTests = {
    rule_files: ['rules.yaml'],
    evaluation_interval: '1m',
    tests: [
      {
        interval: '1m',
        input_series: [
          { series: `vmseed_informer_synced{${s}}`, values: '0x40' },
          // Age grows by 60 s a minute: above 900 s from minute 16.
          { series: `vmseed_informer_last_event_age_seconds{${s}}`, values: '0+60x40' },
          { series: `vmseed_informer_restarts_total{${s}, reason="error"}`, values: '0+1x40' },
          // Every VMI waits between 30 and 60 s for its seed.
          { series: `vmseed_seed_ready_latency_seconds_bucket{${s}, le="30"}`, values: '0x40' },
          { series: `vmseed_seed_ready_latency_seconds_bucket{${s}, le="60"}`, values: '0+10x40' },
          { series: `vmseed_seed_ready_latency_seconds_bucket{${s}, le="+Inf"}`, values: '0+10x40' },
          {
            series: `vmseed_injection_duration_seconds_count{${s}, operation="attach", result="error"}`,
            values: '0+1x40',
          },
          {
            series: `vmseed_injection_duration_seconds_count{${s}, operation="attach", result="success"}`,
            values: '0+5x40',
          },
          // Half the reconciles fail.
          { series: `vmseed_reconcile_total{${s}, result="success"}`, values: '0+1x40' },
          { series: `vmseed_reconcile_total{${s}, result="error"}`, values: '0+1x40' },
          { series: `vmseed_reconcile_errors_total{${s}, code="SECRET_NOT_FOUND"}`, values: '0+1x40' },
          { series: `vmseed_workqueue_longest_running_seconds{${s}}`, values: '0+60x40' },
          { series: `up{${s}}`, values: '1x5 0x30' },
        ],
        alert_rule_test: [
          { eval_time: '4m', alertname: 'VmseedInformerNotSynced', exp_alerts: [] },
          { eval_time: '6m', alertname: 'VmseedInformerNotSynced', exp_alerts: firing('critical') },
          { eval_time: '19m', alertname: 'VmseedInformerStale', exp_alerts: [] },
          { eval_time: '22m', alertname: 'VmseedInformerStale', exp_alerts: firing('warning') },
          { eval_time: '5m', alertname: 'VmseedInformerRestarting', exp_alerts: [] },
          { eval_time: '10m', alertname: 'VmseedInformerRestarting', exp_alerts: firing('warning') },
          { eval_time: '14m', alertname: 'VmseedSeedReadyLatencyHigh', exp_alerts: [] },
          { eval_time: '17m', alertname: 'VmseedSeedReadyLatencyHigh', exp_alerts: firing('warning') },
          { eval_time: '9m', alertname: 'VmseedInjectionErrors', exp_alerts: [] },
          {
            eval_time: '12m',
            alertname: 'VmseedInjectionErrors',
            exp_alerts: firing('warning', { operation: 'attach' }),
          },
          { eval_time: '14m', alertname: 'VmseedSeedFailuresRising', exp_alerts: [] },
          { eval_time: '16m', alertname: 'VmseedSeedFailuresRising', exp_alerts: firing('warning') },
          {
            eval_time: '20m',
            alertname: 'VmseedSeedErrorCode',
            exp_alerts: firing('info', { code: 'SECRET_NOT_FOUND' }),
          },
          { eval_time: '9m', alertname: 'VmseedWorkqueueStuck', exp_alerts: [] },
          { eval_time: '12m', alertname: 'VmseedWorkqueueStuck', exp_alerts: firing('warning') },
          { eval_time: '14m', alertname: 'VmseedAgentDown', exp_alerts: [] },
          {
            eval_time: '16m',
            alertname: 'VmseedAgentDown',
            exp_alerts: [
              { exp_labels: { severity: 'critical', node: 'n1', job: 'vmseed', instance: '10.0.0.1:8080' } },
            ],
          },
        ],
      },
    ],
  };
  const tested = new Set(unitTests.tests[0].alert_rule_test.map((t) => t.alertname));
  assert.deepEqual([...tested].sort(), alerts.map((a) => a.alert!).sort(), 'every alert has a firing test');
  writeFileSync(join(dir, 'tests.yaml'), yaml.dump(unitTests));
  const result = await run('promtool', ['test', 'rules', join(dir, 'tests.yaml')]).then(
    (r) => r.stdout + r.stderr,
    (e: { stdout: string; stderr: string }) => assert.fail(e.stdout + e.stderr),
  );
  assert.match(result, /SUCCESS/);
});
