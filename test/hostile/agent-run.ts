// `bin/vmseed agent --local DIR` as the DaemonSet runs it (its NODE_OPTIONS,
// read from manifests/daemonset.yaml), for the hostile corpus test and
// bench/hostile.ts: manifests in, /status.json and /proc/<pid>/status out.
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { lstatSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { findObject, loadYamlDocuments } from '../support/manifests.ts';
import type { AgentStatusSnapshot } from '../../src/status/snapshot.ts';

const ROOT = new URL('../../', import.meta.url).pathname;

// The agent container's NODE_OPTIONS in the shipped DaemonSet.
export function daemonSetNodeOptions(): string {
  const ds = findObject(loadYamlDocuments('manifests/daemonset.yaml'), 'DaemonSet') as unknown as {
    spec: {
      template: { spec: { containers: Array<{ name: string; env?: Array<{ name: string; value?: string }> }> } };
    };
  };
  const agent = ds.spec.template.spec.containers.find((c) => c.name === 'agent');
  const value = agent?.env?.find((e) => e.name === 'NODE_OPTIONS')?.value;
  if (!value) throw new Error('manifests/daemonset.yaml sets no NODE_OPTIONS on the agent container');
  return value;
}

export interface LocalAgent {
  child: ChildProcess;
  url: string;
  log(): string;
  status(): Promise<AgentStatusSnapshot>;
  // Peak resident set (VmHWM) so far, in bytes.
  peakRss(): number;
  stop(): Promise<number | null>;
}

export async function startLocalAgent(manifests: string, stateDir: string, extra: string[] = []): Promise<LocalAgent> {
  const child = spawn(
    join(ROOT, 'bin/vmseed'),
    ['agent', '--local', manifests, '--state-dir', stateDir, '--listen', '127.0.0.1:0', '--fsync', 'false', ...extra],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, NODE_OPTIONS: daemonSetNodeOptions() },
    },
  );
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
    child.kill('SIGTERM');
    // Grace for a clean exit on a loaded machine; SIGKILL (exit code null) fails the caller.
    const t = setTimeout(() => child.kill('SIGKILL'), 60_000);
    try {
      return await exited;
    } finally {
      clearTimeout(t);
    }
  };
  let url: string | undefined;
  const deadline = Date.now() + 90_000;
  while (!(url = /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(log)?.[1])) {
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop();
      throw new Error(`the agent did not report its listen address; log:\n${log.slice(-3000)}`);
    }
    await sleep(50);
  }
  const base = url;
  return {
    child,
    url: base,
    log: () => log,
    status: async () => (await (await fetch(`${base}/status.json`)).json()) as AgentStatusSnapshot,
    peakRss: () => {
      const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${child.pid}/status`, 'utf8'));
      if (!m) throw new Error('no VmHWM in /proc/<pid>/status');
      return Number(m[1]) * 1024;
    },
    stop,
  };
}

// Editors and kubectl-like tools replace files atomically.
export async function put(path: string, text: string): Promise<void> {
  await writeFile(`${path}.partial`, text);
  await rename(`${path}.partial`, path);
}

export async function freshDir(path: string): Promise<string> {
  await rm(path, { recursive: true, force: true });
  await mkdir(path, { recursive: true });
  return path;
}

// Every entry under `dir` (not following symlinks): type, mode, size,
// content hash or link target. Equal before and after = nothing changed.
export function treeDigest(dir: string): string {
  const lines: string[] = [];
  const walk = (d: string, rel: string) => {
    for (const n of readdirSync(d).sort()) {
      const p = join(d, n);
      const r = rel ? `${rel}/${n}` : n;
      const st = lstatSync(p);
      if (st.isSymbolicLink()) lines.push(`${r} link ${readlinkSync(p)}`);
      else if (st.isDirectory()) {
        lines.push(`${r} dir ${st.mode.toString(8)}`);
        walk(p, r);
      } else if (st.isFile())
        lines.push(
          `${r} file ${st.mode.toString(8)} ${st.size} ${createHash('sha256').update(readFileSync(p)).digest('hex')}`,
        );
      else lines.push(`${r} special ${st.mode.toString(8)}`);
    }
  };
  walk(dir, '');
  return lines.join('\n');
}

export async function waitUntil<T>(
  what: string,
  fn: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs: number,
  detail?: () => string | Promise<string>,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail ? `\n${await detail()}` : ''}`);
    await sleep(100);
  }
}
