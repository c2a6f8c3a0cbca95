import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
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
  // docs/metrics/service/service-metrics.md (STABLE): the vmseed-webhook
  // Service exists only where the webhook component is deployed.
  ['kube_service_info', ['namespace', 'service', 'uid', 'cluster_ip', 'external_name', 'load_balancer_ip']],
]);

// The target labels the Prometheus Operator puts on every series it scrapes
// (ServiceMonitor and PodMonitor), besides job and instance, and the node
// label servicemonitor.yaml adds.
const TARGET_LABELS = new Set(['job', 'instance', 'node', 'namespace', 'pod', 'container', 'service', 'endpoint']);

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
  assert.ok(reads('vmseed_vmi_state_since_timestamp_seconds').length >= 2, 'held at the gate, pending too long');
  assert.ok(reads('vmseed_seeded_after_boot_total').length > 0);
  assert.ok(reads('vmseed_webhook_certificate_expiry_timestamp_seconds').length >= 2, 'expiring, missing');
  assert.ok(reads('workqueue_longest_running_processor_seconds').length > 0, "client-go's name");
  // Grouping and matching labels an alert uses exist on the metric (plus the
  // target labels the ServiceMonitor adds).
  const readable = await readableMetrics();
  for (const rule of alerts) {
    for (const m of rule.expr.matchAll(/\b(?:by|on|group_left) \(([^)]*)\)/g)) {
      for (const label of m[1]
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)) {
        if (label === 'le' || TARGET_LABELS.has(label)) continue;
        const metrics = metricNamesInExpr(rule.expr).filter((n) => readable.has(n));
        assert.ok(
          metrics.some((n) => readable.get(n)!.labels.includes(label)),
          `${rule.alert}: no metric has label ${label}`,
        );
      }
    }
  }
});

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

// KubeVirt's alert labels (kubevirt/kubevirt pkg/monitoring/rules/alerts/
// alerts.go): severity, operator_health_impact, and the part-of and
// component labels every alert gets.
test("every alert carries KubeVirt's alert labels, and nothing else", () => {
  for (const rule of alerts) {
    assert.deepEqual(Object.keys(rule.labels ?? {}).sort(), [
      'kubernetes_operator_component',
      'kubernetes_operator_part_of',
      'operator_health_impact',
      'severity',
    ]);
    assert.match(rule.labels!.operator_health_impact, /^(critical|warning|none)$/, rule.alert);
    assert.equal(rule.labels!.kubernetes_operator_part_of, 'kubevirt', rule.alert);
    assert.equal(rule.labels!.kubernetes_operator_component, 'vmseed', rule.alert);
    assert.match(rule.alert!, /^Vmseed[A-Z]/, 'the runbook delimiter "/Vmseed" starts every page name');
  }
});

test('as installed (kubectl apply -k manifests/monitoring), every runbook_url is absolute and leads to its page in docs/runbooks/', async () => {
  const objects = await kustomize(ROOT + 'manifests/monitoring');
  assert.deepEqual(
    objects.map((o) => o.kind).sort(),
    ['ConfigMap', 'PodMonitor', 'PrometheusRule', 'ServiceMonitor'],
    'the runbook base is build input only; the ConfigMap is the dashboard',
  );
  const [runbooks] = loadYamlDocuments('manifests/monitoring/runbooks.yaml') as Any[];
  const base = new URL(runbooks.data.base as string);
  assert.equal(base.protocol, 'https:');
  assert.ok(!base.href.includes('/Vmseed'), 'the base holds no delimiter');
  // The base names a directory of this repository: <repo>/blob/<ref>/<path>.
  const dir = /^\/[^/]+\/[^/]+\/blob\/[^/]+\/(.+)$/.exec(base.pathname)?.[1];
  assert.equal(dir, 'docs/runbooks');
  const urls = runbookUrls(objects);
  assert.equal(urls.size, alerts.length);
  for (const [alert, url] of urls) {
    assert.equal(url, `${base.href}/${alert}.md`, alert);
    assert.ok(existsSync(`${ROOT}${dir}/${alert}.md`), `${alert}: no page ${dir}/${alert}.md`);
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
  assert.ok(!base.includes('github.com'), 'the overlay moves the links elsewhere');
  const urls = runbookUrls(await kustomize(dir));
  assert.equal(urls.size, alerts.length);
  for (const [alert, url] of urls) assert.equal(url, `${base}/${alert}.md`);
});

// Grafana's dashboard sidecar (kube-prometheus-stack's default label
// grafana_dashboard: "1") loads every ConfigMap so labelled.
test('the monitoring kustomization installs the dashboard as a ConfigMap the Grafana sidecar loads', async () => {
  const objects = await kustomize(ROOT + 'manifests/monitoring');
  const maps = objects.filter((o) => o.kind === 'ConfigMap');
  assert.equal(maps.length, 1);
  const [cm] = maps;
  assert.equal(cm.metadata.name, 'vmseed-grafana-dashboard', 'a fixed name: a change replaces it');
  assert.equal(cm.metadata.namespace, 'vmseed');
  assert.equal(cm.metadata.labels?.grafana_dashboard, '1');
  assert.deepEqual(Object.keys(cm.data), ['vmseed.json']);
  assert.deepEqual(JSON.parse(cm.data['vmseed.json'] as string), dashboard);
});

test('the cluster component is scraped as its own job, the agents with their VMI labels honoured', async () => {
  const objects = await kustomize(ROOT + 'manifests/monitoring');
  const pm = objects.find((o) => o.kind === 'PodMonitor');
  assert.deepEqual(pm.spec.selector.matchLabels, {
    'app.kubernetes.io/name': 'vmseed',
    'app.kubernetes.io/component': 'cluster',
  });
  const [endpoint] = pm.spec.podMetricsEndpoints;
  assert.equal(endpoint.port, 'http-metrics');
  assert.ok(
    endpoint.relabelings.some((r: Any) => r.targetLabel === 'job' && r.replacement === 'vmseed-cluster'),
    'job vmseed-cluster',
  );
  // The port exists on the component's container (manifests/cluster.yaml).
  const cluster = loadYamlDocuments('manifests/cluster.yaml').find((o: Any) => o.kind === 'Deployment') as Any;
  const ports = cluster.spec.template.spec.containers[0].ports.map((p: Any) => p.name);
  assert.ok(ports.includes('http-metrics'));
  const sm = objects.find((o) => o.kind === 'ServiceMonitor');
  assert.equal(sm.spec.endpoints[0].honorLabels, true, "a VMI's namespace label is kept as namespace");
  // What honorLabels keeps: the agent's labels that share a name with a
  // target label (the VMI's namespace, the datasource's endpoint); never
  // the job, instance or node the alerts group by.
  const clashing = new Set<string>();
  for (const [, info] of await exportedMetricNames({ processMetrics: true }))
    for (const label of info.labels) if (TARGET_LABELS.has(label)) clashing.add(label);
  assert.deepEqual([...clashing].sort(), ['endpoint', 'namespace']);
  // What the alerts read of the webhook comes from that job only.
  for (const rule of alerts.filter((a) => a.expr.includes('vmseed_webhook_')))
    for (const m of rule.expr.matchAll(/vmseed_webhook_\w+\{([^}]*)\}/g)) assert.match(m[1], /job="vmseed-cluster"/);
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
// The agent's scrape target as the ServiceMonitor names it: the Prometheus
// Operator adds namespace and container.
const upAgent = (node: string, ip: string) =>
  `up{job="vmseed", namespace="vmseed", container="agent", node="${node}", instance="${ip}:8080"}`;
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
  { series: upAgent('n1', '10.0.0.1'), values: '1x30' },
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
      { series: upAgent('n2', '10.0.0.2'), values: '1 0x29' },
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
        exp_alerts: [{ exp_labels: { severity: 'critical', job: 'vmseed', namespace: 'vmseed', container: 'agent' } }],
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
      { series: upAgent('n2', '10.0.0.2'), values: '1x30' },
    ],
    alert_rule_test: [{ eval_time: '25m', alertname: 'VmseedAgentDown', exp_alerts: [] }],
  },
  {
    name: "scoped to vmseed's namespace and agent container: failures elsewhere fire nothing",
    interval: '1m',
    input_series: [
      ...healthyN1,
      ...daemonSet(1, 1),
      // A DaemonSet of the same name in a tenant's namespace, never Ready
      // and never scraped, and its DaemonSet short of pods.
      {
        series:
          'kube_pod_info{namespace="tenant", pod="vmseed-t1", node="n2", created_by_kind="DaemonSet", created_by_name="vmseed"}',
        values: '1x30',
      },
      { series: 'kube_pod_status_ready{namespace="tenant", pod="vmseed-t1", condition="true"}', values: '0x30' },
      {
        series: 'kube_daemonset_status_desired_number_scheduled{namespace="tenant", daemonset="vmseed"}',
        values: '3x30',
      },
      {
        series: 'kube_daemonset_status_current_number_scheduled{namespace="tenant", daemonset="vmseed"}',
        values: '1x30',
      },
      // Another job called vmseed elsewhere, and another container of the
      // agent's pod, both down.
      {
        series: 'up{job="vmseed", namespace="tenant", container="agent", node="n2", instance="10.0.9.2:8080"}',
        values: '0x30',
      },
      {
        series: 'up{job="vmseed", namespace="vmseed", container="other", node="n1", instance="10.0.0.1:9000"}',
        values: '0x30',
      },
      // Any pod of the cluster not Ready.
      { series: 'kube_pod_status_ready{namespace="kube-system", pod="coredns-1", condition="true"}', values: '0x30' },
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

// The agent's per-VMI series on n1 (honoured labels: namespace and name are
// the VMI's). promtool's clock starts at Unix time 0, so a state entered at
// minute m has the timestamp 60*m.
const vmiSince = (namespace: string, name: string, state: string, code: string) =>
  `vmseed_vmi_state_since_timestamp_seconds{job="vmseed", node="n1", instance="10.0.0.1:8080", namespace="${namespace}", name="${name}", state="${state}", code="${code}"}`;
const vmiCase = {
  name: 'VMIs held at the seed gate or pending on a code: each alerts past its threshold, named by the VMI',
  interval: '1m',
  input_series: [
    // Held at the gate from minute 0: past 300 s after minute 5.
    { series: vmiSince('ns1', 'held', 'pending', 'SEED_GATE_WAITING'), values: '0x40' },
    // Waiting for its launcher pod from minute 0: past 900 s after minute 15.
    { series: vmiSince('ns2', 'waiting', 'pending', 'LAUNCHER_POD_UNKNOWN'), values: '0x40' },
    // Queued (no code) from minute 10: past 900 s after minute 25.
    { series: vmiSince('ns3', 'queued', 'pending', ''), values: '600x40' },
    // Waited for its domain for 8 minutes, then seeded.
    { series: vmiSince('ns2', 'recovered', 'pending', 'DOMAIN_NOT_FOUND'), values: '0x8' },
    { series: vmiSince('ns2', 'recovered', 'ready', ''), values: '_x8 540x32' },
    // Ready, or failed, for a long time: neither is a wait.
    { series: vmiSince('ns1', 'done', 'ready', ''), values: '0x40' },
    { series: vmiSince('ns1', 'broken', 'error', 'USERDATA_BASE64_INVALID'), values: '0x40' },
    {
      series:
        'vmseed_vmi_info{job="vmseed", node="n1", instance="10.0.0.1:8080", namespace="ns1", name="held", state="pending", code="SEED_GATE_WAITING"}',
      values: '1x40',
    },
  ],
  alert_rule_test: [
    { eval_time: '5m', alertname: 'VmseedVmiHeldAtSeedGate', exp_alerts: [] },
    {
      eval_time: '7m',
      alertname: 'VmseedVmiHeldAtSeedGate',
      exp_alerts: [{ exp_labels: { node: 'n1', namespace: 'ns1', name: 'held' } }],
    },
    { eval_time: '16m', alertname: 'VmseedVmiPendingTooLong', exp_alerts: [] },
    {
      eval_time: '18m',
      alertname: 'VmseedVmiPendingTooLong',
      exp_alerts: [{ exp_labels: { node: 'n1', namespace: 'ns2', name: 'waiting', code: 'LAUNCHER_POD_UNKNOWN' } }],
    },
    {
      eval_time: '28m',
      alertname: 'VmseedVmiPendingTooLong',
      exp_alerts: [
        { exp_labels: { node: 'n1', namespace: 'ns2', name: 'waiting', code: 'LAUNCHER_POD_UNKNOWN' } },
        { exp_labels: { node: 'n1', namespace: 'ns3', name: 'queued' } },
      ],
    },
  ],
};

const seededAfterBootCase = {
  name: 'a seed attached to a running domain on n1 at minute 6: one alert, for the disk datasource',
  interval: '1m',
  input_series: [
    {
      series: 'vmseed_seeded_after_boot_total{job="vmseed", node="n1", instance="10.0.0.1:8080", datasource="disk"}',
      values: '0x5 1x40',
    },
    {
      series:
        'vmseed_seeded_after_boot_total{job="vmseed", node="n1", instance="10.0.0.1:8080", datasource="nocloud-http"}',
      values: '0x45',
    },
    {
      series: 'vmseed_seeded_after_boot_total{job="vmseed", node="n2", instance="10.0.0.2:8080", datasource="disk"}',
      values: '0x45',
    },
  ],
  alert_rule_test: [
    { eval_time: '5m', alertname: 'VmseedSeededAfterBoot', exp_alerts: [] },
    {
      eval_time: '8m',
      alertname: 'VmseedSeededAfterBoot',
      exp_alerts: [{ exp_labels: { node: 'n1', datasource: 'disk' } }],
    },
    // Out of the 30-minute window.
    { eval_time: '40m', alertname: 'VmseedSeededAfterBoot', exp_alerts: [] },
  ],
};

// The webhook's certificate, as the cluster component's pods export it
// (job vmseed-cluster, podmonitor.yaml), and the webhook's Service from
// kube-state-metrics where deploy/components/webhook is installed.
const certSeries = (pod: string, values: string) => ({
  series: `vmseed_webhook_certificate_expiry_timestamp_seconds{job="vmseed-cluster", namespace="vmseed", pod="${pod}", container="cluster", instance="${pod}:8080"}`,
  values,
});
const webhookService = {
  series: 'kube_service_info{namespace="vmseed", service="vmseed-webhook", cluster_ip="10.96.0.10"}',
  values: '1x60',
};
const webhookCases = [
  {
    name: 'webhook deployed: one pod without its certificate for 20 minutes, another whose certificate ends in 7 days and 30 minutes',
    interval: '1m',
    input_series: [
      webhookService,
      certSeries('vmseed-cluster-a', `${7 * 86400 + 1800}x60`),
      certSeries('vmseed-cluster-b', `0x20 ${30 * 86400}x40`),
    ],
    alert_rule_test: [
      { eval_time: '9m', alertname: 'VmseedWebhookCertificateMissing', exp_alerts: [] },
      {
        eval_time: '11m',
        alertname: 'VmseedWebhookCertificateMissing',
        exp_alerts: [{ exp_labels: { namespace: 'vmseed', pod: 'vmseed-cluster-b' } }],
      },
      { eval_time: '25m', alertname: 'VmseedWebhookCertificateMissing', exp_alerts: [] },
      // Under 7 days left from minute 30; 0 (none loaded) is not "expiring".
      { eval_time: '39m', alertname: 'VmseedWebhookCertificateExpiringSoon', exp_alerts: [] },
      {
        eval_time: '42m',
        alertname: 'VmseedWebhookCertificateExpiringSoon',
        exp_alerts: [{ exp_labels: { namespace: 'vmseed', pod: 'vmseed-cluster-a' } }],
      },
    ],
  },
  {
    name: 'webhook deployed, and no cluster component pod reports its certificate',
    interval: '1m',
    input_series: [webhookService],
    alert_rule_test: [
      { eval_time: '9m', alertname: 'VmseedWebhookCertificateMissing', exp_alerts: [] },
      {
        eval_time: '11m',
        alertname: 'VmseedWebhookCertificateMissing',
        exp_alerts: [{ exp_labels: { job: 'vmseed-cluster' } }],
      },
    ],
  },
  {
    name: 'no webhook deployed: the cluster component reports no certificate (0), nothing fires',
    interval: '1m',
    input_series: [
      certSeries('vmseed-cluster-a', '0x60'),
      {
        series: 'kube_service_info{namespace="vmseed", service="vmseed-cluster", cluster_ip="10.96.0.11"}',
        values: '1x60',
      },
    ],
    alert_rule_test: [
      { eval_time: '30m', alertname: 'VmseedWebhookCertificateMissing', exp_alerts: [] },
      { eval_time: '30m', alertname: 'VmseedWebhookCertificateExpiringSoon', exp_alerts: [] },
    ],
  },
];

interface RuleTestGroup {
  name?: string;
  interval: string;
  input_series: { series: string; values: string }[];
  alert_rule_test: { eval_time: string; alertname: string; exp_alerts: { exp_labels: Record<string, string> }[] }[];
}

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
          { series: `workqueue_longest_running_processor_seconds{${s}, name="vmi"}`, values: '0+60x40' },
          { series: upAgent('n1', '10.0.0.1'), values: '1x5 0x30' },
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
      vmiCase,
      seededAfterBootCase,
      ...webhookCases,
    ] as RuleTestGroup[],
  };
  // An alert's labels are the series' and the rule's: each expectation gets
  // its rule's (severity, operator_health_impact, ...) added here.
  const ruleLabels = new Map(alerts.map((a) => [a.alert!, a.labels ?? {}]));
  for (const g of unitTests.tests)
    for (const check of g.alert_rule_test)
      for (const a of check.exp_alerts) a.exp_labels = { ...ruleLabels.get(check.alertname), ...a.exp_labels };
  // The series the tests feed in are ones that really exist: the agent's
  // (and cluster component's) registry, the redirect container's,
  // kube-state-metrics' and Prometheus' `up`, with those labels (plus the
  // target labels).
  const readable = await readableMetrics();
  for (const g of unitTests.tests)
    for (const { series } of g.input_series) {
      const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?$/.exec(series);
      assert.ok(m, series);
      const info = readable.get(m[1]);
      if (m[1] === 'vmseed_unrelated_series') continue; // stands for "no target at all"
      assert.ok(info, `${g.name ?? 'main'}: nothing exports ${m[1]}`);
      for (const [, label] of (m[2] ?? '').matchAll(/([A-Za-z_][A-Za-z0-9_]*)="/g)) {
        if (label === 'le' || TARGET_LABELS.has(label) || PROMETHEUS_SYNTHETIC.has(m[1])) continue;
        assert.ok(info.labels.includes(label), `${series}: ${m[1]} has no label ${label}`);
      }
    }
  const tested = new Set(unitTests.tests.flatMap((g) => g.alert_rule_test.map((t) => t.alertname)));
  assert.deepEqual([...tested].sort(), alerts.map((a) => a.alert!).sort(), 'every alert has a firing test');
  writeFileSync(join(dir, 'tests.yaml'), yaml.dump(unitTests));
  const result = await run('promtool', ['test', 'rules', join(dir, 'tests.yaml')]).then(
    (r) => r.stdout + r.stderr,
    (e: { stdout: string; stderr: string }) => assert.fail(e.stdout + e.stderr),
  );
  assert.match(result, /SUCCESS/);
});
