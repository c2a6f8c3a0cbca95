import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import * as yaml from 'js-yaml';
import { ROOT, loadYamlDocuments } from '../support/manifests.ts';
import {
  concreteGrafanaQuery,
  exportedMetricNames,
  metricNamesInExpr,
  promtoolCheckRules,
  redirectMetricNames,
  type RuleGroupFile,
} from '../support/promql.ts';

const run = promisify(execFile);

// Prometheus writes `up` for every target itself.
const PROMETHEUS_SYNTHETIC = new Set(['up']);

// What VmseedAgentDown reads from kube-state-metrics (kube-prometheus-stack
// installs it), with the labels of each as kube-state-metrics documents them
// (docs/metrics/workload/{pod,daemonset}-metrics.md, all STABLE): a node whose
// agent never started has no vmseed series at all.
const KUBE_STATE_METRICS = new Map<string, string[]>([
  ['kube_pod_status_ready', ['namespace', 'pod', 'uid', 'condition']],
  ['kube_pod_info', ['namespace', 'pod', 'uid', 'node', 'created_by_kind', 'created_by_name', 'host_ip', 'pod_ip']],
  ['kube_daemonset_status_desired_number_scheduled', ['namespace', 'daemonset']],
  ['kube_daemonset_status_current_number_scheduled', ['namespace', 'daemonset']],
]);

// Every name a rule may read, with its labels: the agent's registry, the
// redirect container's, Prometheus' `up` and the kube-state-metrics above.
async function readableMetrics(): Promise<Map<string, { labels: string[] }>> {
  const names = new Map<string, { labels: string[] }>(await exportedMetricNames({ processMetrics: true }));
  for (const [name, info] of await redirectMetricNames()) names.set(name, info);
  for (const [name, labels] of KUBE_STATE_METRICS) names.set(name, { labels });
  for (const name of PROMETHEUS_SYNTHETIC) names.set(name, { labels: [] });
  return names;
}

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

test('alert expressions read only metrics the agent, the redirect container, Prometheus or kube-state-metrics export', async () => {
  const readable = await readableMetrics();
  for (const rule of alerts) {
    const names = metricNamesInExpr(rule.expr);
    assert.ok(names.length > 0, `${rule.alert}: reads no metric`);
    for (const name of names) assert.ok(readable.has(name), `${rule.alert}: nothing exports ${name}`);
  }
});

test('the alerts cover seed failures, the informer, seed-ready latency, injection errors and the redirect', async () => {
  const reads = (metric: string) =>
    alerts.filter((a) => metricNamesInExpr(a.expr).some((n) => n.startsWith(metric))).map((a) => a.alert);
  assert.ok(reads('vmseed_reconcile_total').length > 0);
  assert.ok(reads('vmseed_informer_synced').length > 0);
  assert.ok(reads('vmseed_informer_last_event_age_seconds').length > 0);
  assert.ok(reads('vmseed_seed_ready_latency_seconds').length > 0);
  assert.ok(reads('vmseed_injection_duration_seconds').length > 0);
  assert.ok(reads('vmseed_redirect_in_place').length > 0);
  assert.ok(reads('kube_pod_status_ready').length > 0, 'a pod that never started is seen');
  // Grouping and matching labels an alert uses exist on the metric (plus the
  // target labels the ServiceMonitor adds).
  const readable = await readableMetrics();
  for (const rule of alerts) {
    for (const m of rule.expr.matchAll(/\b(?:by|on|group_left) \(([^)]*)\)/g)) {
      for (const label of m[1]
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)) {
        if (['node', 'le', 'job', 'instance'].includes(label)) continue;
        const metrics = metricNamesInExpr(rule.expr).filter((n) => readable.has(n));
        assert.ok(
          metrics.some((n) => readable.get(n)!.labels.includes(label)),
          `${rule.alert}: no metric has label ${label}`,
        );
      }
    }
  }
});

// GitHub's heading anchors: lower case, punctuation dropped, spaces to '-'.
function markdownAnchors(file: string): Set<string> {
  const text = readFileSync(ROOT + file, 'utf8');
  return new Set(
    [...text.matchAll(/^#{1,6} (.+)$/gm)].map((m) =>
      m[1]
        .trim()
        .toLowerCase()
        .replace(/[^a-z0-9 _-]/g, '')
        .replace(/ /g, '-'),
    ),
  );
}

async function kustomize(dir: string): Promise<Any[]> {
  const { stdout, stderr } = await run('kubectl', ['kustomize', dir]);
  assert.equal(stderr, '', `kubectl kustomize ${dir} warns`);
  return yaml.loadAll(stdout) as Any[];
}

type Any = any;

function runbookUrls(objects: Any[]): Map<string, string> {
  const rule = objects.find((o) => o.kind === 'PrometheusRule');
  const urls = new Map<string, string>();
  for (const g of rule.spec.groups) for (const r of g.rules) urls.set(r.alert, r.annotations.runbook_url);
  return urls;
}

test('every alert has a severity, a summary and a description', () => {
  assert.ok(alerts.length >= 5);
  for (const rule of alerts) {
    assert.ok(rule.alert, 'alerting rules only');
    assert.match(rule.labels?.severity ?? '', /^(critical|warning|info)$/, rule.alert);
    assert.ok(rule.annotations?.summary, `${rule.alert}: summary`);
    assert.ok((rule.annotations?.description ?? '').length > 40, `${rule.alert}: description`);
  }
});

test('as installed (kubectl apply -k manifests/monitoring), every runbook_url is absolute and its link leads to the alert section in docs/', async () => {
  const objects = await kustomize(ROOT + 'manifests/monitoring');
  assert.deepEqual(
    objects.map((o) => o.kind).sort(),
    ['PrometheusRule', 'ServiceMonitor'],
    'the base is build input only',
  );
  const [runbooks] = loadYamlDocuments('manifests/monitoring/runbooks.yaml') as Any[];
  const base = new URL(runbooks.data.base as string);
  assert.equal(base.protocol, 'https:');
  // The base names a page of this repository: <repo>/blob/<ref>/<path>.
  const page = /^\/[^/]+\/[^/]+\/blob\/[^/]+\/(.+)$/.exec(base.pathname)?.[1];
  assert.ok(page, `runbook base ${base.href} is not a file of a repository`);
  const anchors = markdownAnchors(page);
  const urls = runbookUrls(objects);
  assert.equal(urls.size, alerts.length);
  for (const [alert, url] of urls) {
    const link = new URL(url);
    assert.equal(link.href.split('#')[0], base.href, alert);
    assert.equal(link.hash, `#alert-${alert.toLowerCase()}`);
    assert.ok(anchors.has(link.hash.slice(1)), `${alert}: ${page} has no section ${link.hash}`);
  }
});

test("a cluster's own overlay moves every runbook link in one place, as docs/operations.md shows", async (t) => {
  const docs = readFileSync(ROOT + 'docs/operations.md', 'utf8');
  const start = docs.indexOf('#### Runbook links');
  const section = docs.slice(start, docs.indexOf('\n#### ', start + 1));
  const blocks = [...section.matchAll(/```yaml\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.equal(blocks.length, 2, 'the section shows kustomization.yaml and runbooks.yaml');
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-runbooks-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  // The docs' overlay sits next to a checkout: point it at this one
  // (kustomize takes relative roots only).
  const monitoring = relative(dir, ROOT + 'manifests/monitoring');
  writeFileSync(join(dir, 'kustomization.yaml'), blocks[0].replace(/\S*manifests\/monitoring\S*/, monitoring));
  writeFileSync(join(dir, 'runbooks.yaml'), blocks[1]);
  const base = (yaml.load(blocks[1]) as Any).data.base as string;
  const urls = runbookUrls(await kustomize(dir));
  assert.equal(urls.size, alerts.length);
  for (const [alert, url] of urls) assert.equal(url, `${base}#alert-${alert.toLowerCase()}`);
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
// A node with no running agent, as kube-state-metrics and Prometheus see
// each way it happens; node n1's agent is healthy throughout.
const ksmPod = (pod: string, node: string) => [
  {
    series: `kube_pod_info{namespace="vmseed", pod="${pod}", node="${node}", created_by_kind="DaemonSet", created_by_name="vmseed"}`,
    values: '1x30',
  },
];
const ready = (pod: string, values: string) => [
  { series: `kube_pod_status_ready{namespace="vmseed", pod="${pod}", condition="true"}`, values },
];
const healthyN1 = [
  ...ksmPod('vmseed-n1', 'n1'),
  ...ready('vmseed-n1', '1x30'),
  { series: 'up{job="vmseed", node="n1", instance="10.0.0.1:8080"}', values: '1x30' },
];
const daemonSet = (desired: number, current: number) => [
  {
    series: 'kube_daemonset_status_desired_number_scheduled{namespace="vmseed", daemonset="vmseed"}',
    values: `${desired}x30`,
  },
  {
    series: 'kube_daemonset_status_current_number_scheduled{namespace="vmseed", daemonset="vmseed"}',
    values: `${current}x30`,
  },
];
const notRunningOnN2 = [{ exp_labels: { severity: 'critical', namespace: 'vmseed', pod: 'vmseed-n2', node: 'n2' } }];
const agentDownCases = [
  {
    name: 'pending: scheduled on n2, never Ready, never scraped',
    interval: '1m',
    input_series: [...healthyN1, ...daemonSet(2, 2), ...ksmPod('vmseed-n2', 'n2'), ...ready('vmseed-n2', '0x30')],
    alert_rule_test: [
      { eval_time: '9m', alertname: 'VmseedAgentDown', exp_alerts: [] },
      { eval_time: '11m', alertname: 'VmseedAgentDown', exp_alerts: notRunningOnN2 },
    ],
  },
  {
    name: 'crash-looping on n2: Ready for a moment after each restart, its target mostly down',
    interval: '1m',
    input_series: [
      ...healthyN1,
      ...daemonSet(2, 2),
      ...ksmPod('vmseed-n2', 'n2'),
      ...ready('vmseed-n2', '1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0'),
      { series: 'up{job="vmseed", node="n2", instance="10.0.0.2:8080"}', values: '1 0x29' },
    ],
    alert_rule_test: [
      { eval_time: '10m', alertname: 'VmseedAgentDown', exp_alerts: [] },
      // One alert per node, named by the pod: the failing scrape adds none.
      { eval_time: '12m', alertname: 'VmseedAgentDown', exp_alerts: notRunningOnN2 },
    ],
  },
  {
    name: 'never scheduled: the DaemonSet wants 3 nodes and has pods on 2',
    interval: '1m',
    input_series: [...healthyN1, ...daemonSet(3, 2), ...ksmPod('vmseed-n2', 'n2'), ...ready('vmseed-n2', '1x30')],
    alert_rule_test: [
      { eval_time: '9m', alertname: 'VmseedAgentDown', exp_alerts: [] },
      { eval_time: '11m', alertname: 'VmseedAgentDown', exp_alerts: [{ exp_labels: { severity: 'critical' } }] },
    ],
  },
  {
    name: 'no target at all: every agent pod gone, or the ServiceMonitor selects nothing',
    interval: '1m',
    input_series: [{ series: 'vmseed_unrelated_series', values: '1x30' }],
    alert_rule_test: [
      { eval_time: '9m', alertname: 'VmseedAgentDown', exp_alerts: [] },
      {
        eval_time: '11m',
        alertname: 'VmseedAgentDown',
        exp_alerts: [{ exp_labels: { severity: 'critical', job: 'vmseed' } }],
      },
    ],
  },
  {
    name: 'healthy: every node has a Ready, scraped agent',
    interval: '1m',
    input_series: [
      ...healthyN1,
      ...daemonSet(2, 2),
      ...ksmPod('vmseed-n2', 'n2'),
      ...ready('vmseed-n2', '1x30'),
      { series: 'up{job="vmseed", node="n2", instance="10.0.0.2:8080"}', values: '1x30' },
    ],
    alert_rule_test: [{ eval_time: '25m', alertname: 'VmseedAgentDown', exp_alerts: [] }],
  },
];
const redirectCase = {
  name: 'the redirect container finds its DNAT missing or reaching something else from minute 4',
  interval: '1m',
  input_series: [
    {
      series: 'vmseed_redirect_in_place{job="vmseed-redirect", node="n1", instance="10.0.0.1:8082"}',
      values: '1x3 0x20',
    },
    { series: 'vmseed_redirect_in_place{job="vmseed-redirect", node="n2", instance="10.0.0.2:8082"}', values: '1x24' },
  ],
  alert_rule_test: [
    { eval_time: '8m', alertname: 'VmseedRedirectNotInPlace', exp_alerts: [] },
    {
      eval_time: '10m',
      alertname: 'VmseedRedirectNotInPlace',
      exp_alerts: [{ exp_labels: { severity: 'warning', node: 'n1' } }],
    },
  ],
};

// cloud-init's reports: on n1 half the first boots fail and one VM has been
// provisioning since minute 0; n2's boots all succeed and finish.
const provisioningCase = {
  name: 'provisioning: failing boots and a VM stuck in cloud-init on n1, all well on n2',
  interval: '1m',
  input_series: [
    {
      series: 'vmseed_provisioning_seconds_count{job="vmseed", node="n1", instance="10.0.0.1:8080", result="fail"}',
      values: '0+1x40',
    },
    {
      series: 'vmseed_provisioning_seconds_count{job="vmseed", node="n1", instance="10.0.0.1:8080", result="success"}',
      values: '0+1x40',
    },
    {
      series: 'vmseed_provisioning_seconds_count{job="vmseed", node="n2", instance="10.0.0.2:8080", result="success"}',
      values: '0+2x40',
    },
    // Above 1800 s from minute 30.
    {
      series: 'vmseed_provisioning_oldest_running_seconds{job="vmseed", node="n1", instance="10.0.0.1:8080"}',
      values: '0+60x50',
    },
    {
      series: 'vmseed_provisioning_oldest_running_seconds{job="vmseed", node="n2", instance="10.0.0.2:8080"}',
      values: '0x50',
    },
  ],
  alert_rule_test: [
    { eval_time: '9m', alertname: 'VmseedProvisioningFailing', exp_alerts: [] },
    {
      eval_time: '12m',
      alertname: 'VmseedProvisioningFailing',
      exp_alerts: [{ exp_labels: { severity: 'warning', node: 'n1' } }],
    },
    { eval_time: '38m', alertname: 'VmseedProvisioningStuck', exp_alerts: [] },
    {
      eval_time: '42m',
      alertname: 'VmseedProvisioningStuck',
      exp_alerts: [{ exp_labels: { severity: 'warning', node: 'n1' } }],
    },
  ],
};

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
          // The scrape fails from minute 6.
          { eval_time: '14m', alertname: 'VmseedAgentDown', exp_alerts: [] },
          { eval_time: '16m', alertname: 'VmseedAgentDown', exp_alerts: firing('critical') },
        ],
      },
      ...agentDownCases,
      redirectCase,
      provisioningCase,
    ],
  };
  const tested = new Set(unitTests.tests.flatMap((g) => g.alert_rule_test.map((t) => t.alertname)));
  assert.deepEqual([...tested].sort(), alerts.map((a) => a.alert!).sort(), 'every alert has a firing test');
  writeFileSync(join(dir, 'tests.yaml'), yaml.dump(unitTests));
  const result = await run('promtool', ['test', 'rules', join(dir, 'tests.yaml')]).then(
    (r) => r.stdout + r.stderr,
    (e: { stdout: string; stderr: string }) => assert.fail(e.stdout + e.stderr),
  );
  assert.match(result, /SUCCESS/);
});
