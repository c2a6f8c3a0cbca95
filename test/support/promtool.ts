// Checks and reads Prometheus text exposition with the real promtool.
import { spawn } from 'node:child_process';

export interface PromtoolResult {
  ok: boolean;
  code: number | null;
  output: string;
}

// `promtool check metrics` reads the exposition on stdin; exit 0 means no
// problems (lint warnings make it exit 3).
export function promtoolCheck(exposition: string, promtool = 'promtool'): Promise<PromtoolResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(promtool, ['check', 'metrics'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d) => (output += d));
    child.stderr.on('data', (d) => (output += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ ok: code === 0, code, output }));
    child.stdin.end(exposition);
  });
}

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

// Enough of the text format for tests: one sample per line, label values
// with \\, \" and \n escapes.
export function parseExposition(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$/.exec(line);
    if (!m) throw new Error(`unparseable exposition line: ${line}`);
    const labels: Record<string, string> = {};
    if (m[2]) {
      const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?/g;
      let lm: RegExpExecArray | null;
      while ((lm = re.exec(m[2]))) labels[lm[1]] = lm[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    }
    const v = m[3];
    samples.push({ name: m[1], labels, value: v === '+Inf' ? Infinity : v === '-Inf' ? -Infinity : Number(v) });
  }
  return samples;
}

export function sampleValue(samples: Sample[], name: string, labels: Record<string, string> = {}): number | undefined {
  const hit = samples.find(
    (s) =>
      s.name === name &&
      Object.entries(labels).every(([k, v]) => s.labels[k] === v) &&
      Object.keys(s.labels).length === Object.keys(labels).length,
  );
  return hit?.value;
}

// Cumulative bucket counts of one histogram series, keyed by the numeric
// upper bound (`le` may be written 5e-05 or 0.00005; +Inf is Infinity).
export function histogramBuckets(
  samples: Sample[],
  name: string,
  labels: Record<string, string> = {},
): Map<number, number> {
  const out = new Map<number, number>();
  for (const s of samples) {
    if (s.name !== `${name}_bucket`) continue;
    const { le, ...rest } = s.labels;
    if (Object.keys(rest).length !== Object.keys(labels).length) continue;
    if (!Object.entries(labels).every(([k, v]) => rest[k] === v)) continue;
    out.set(le === '+Inf' ? Infinity : Number(le), s.value);
  }
  return out;
}
