// Which metric names a PromQL expression reads, and which names the agent
// exports (from the registry in src/metrics/metrics.ts, not a copied list).
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import * as yaml from 'js-yaml';
import type { Registry } from 'prom-client';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { createRedirectMetrics } from '../../src/redirect/redirect-metrics.ts';

const run = promisify(execFile);

// Keywords, aggregation operators and functions are followed by `(` or are
// binary operators; everything else left over is a metric name.
const KEYWORDS = new Set([
  'and',
  'or',
  'unless',
  'bool',
  'offset',
  'by',
  'without',
  'on',
  'ignoring',
  'group_left',
  'group_right',
  'inf',
  'nan',
]);

export function metricNamesInExpr(expr: string): string[] {
  let s = expr;
  s = s.replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, ' '); // strings
  s = s.replace(/\{[^}]*\}/g, ' '); // label matchers
  s = s.replace(/\[[^\]]*\]/g, ' '); // range / subquery durations
  s = s.replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' '); // label lists
  s = s.replace(/\$\{?[A-Za-z_][A-Za-z0-9_]*\}?/g, ' '); // Grafana variables
  s = s.replace(/[A-Za-z_][A-Za-z0-9_]*\s*\(/g, '('); // function and aggregation names
  const names = new Set<string>();
  for (const m of s.matchAll(/(?<![A-Za-z0-9_.])[A-Za-z_:][A-Za-z0-9_:]*/g)) {
    const token = m[0];
    if (KEYWORDS.has(token.toLowerCase())) continue;
    names.add(token);
  }
  return [...names].sort();
}

// Every sample name the agent's /metrics can contain: each metric, plus
// _bucket/_sum/_count for histograms and _sum/_count for summaries.
export async function exportedMetricNames(options: {
  processMetrics: boolean;
}): Promise<Map<string, { type: string; help: string; labels: string[] }>> {
  return registryMetricNames(createMetrics({ version: 'test', processMetrics: options.processMetrics }).registry);
}

// The redirect container's /metrics: a process and registry of its own.
export async function redirectMetricNames(): Promise<Map<string, { type: string; help: string; labels: string[] }>> {
  return registryMetricNames(createRedirectMetrics().registry);
}

async function registryMetricNames(registry: Registry) {
  const labelNames = new Map<string, string[]>();
  for (const m of registry.getMetricsAsArray()) {
    labelNames.set(m.name, [...((m as unknown as { labelNames?: readonly string[] }).labelNames ?? [])]);
  }
  const out = new Map<string, { type: string; help: string; labels: string[] }>();
  for (const m of await registry.getMetricsAsJSON()) {
    const info = { type: String(m.type), help: m.help, labels: labelNames.get(m.name) ?? [] };
    out.set(m.name, info);
    if (info.type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) out.set(m.name + suffix, info);
    if (info.type === 'summary') for (const suffix of ['_sum', '_count']) out.set(m.name + suffix, info);
  }
  return out;
}

// Grafana's variables made concrete so that promtool can parse the query.
export function concreteGrafanaQuery(expr: string): string {
  return expr
    .replaceAll('$__rate_interval', '5m')
    .replaceAll('$__interval', '1m')
    .replace(/\$\{?[A-Za-z_][A-Za-z0-9_]*\}?/g, '.*');
}

export interface RuleGroupFile {
  groups: { name: string; rules: Record<string, unknown>[] }[];
}

// `promtool check rules` on a rule group file; resolves with its output,
// rejects (with stdout/stderr) when promtool finds a problem.
export async function promtoolCheckRules(groups: RuleGroupFile): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-rules-'));
  const file = join(dir, 'rules.yaml');
  try {
    writeFileSync(file, yaml.dump(groups));
    const { stdout, stderr } = await run('promtool', ['check', 'rules', file]);
    return stdout + stderr;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
