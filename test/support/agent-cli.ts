// The agent CLI (`src/main.ts agent …`) as a child process, for tests that
// probe its HTTP endpoints: listens on an ephemeral port, collects its
// output, stops with SIGTERM (SIGKILL after 15 s). Its start (Node loading
// every module) took over 15 s on a loaded two-core machine: waits are long.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { waitFor } from './agent-harness.ts';

const ROOT = new URL('../../', import.meta.url).pathname;

export interface CliAgent {
  output(): string;
  url(): Promise<string>;
  stop(): Promise<number | null>;
}

export function startCliAgent(
  args: string[],
  o: { env?: Record<string, string>; uid?: number; gid?: number } = {},
): CliAgent {
  const child = spawn(process.execPath, [join(ROOT, 'src/main.ts'), 'agent', ...args, '--listen', '127.0.0.1:0'], {
    env: { ...process.env, ...o.env },
    stdio: ['ignore', 'pipe', 'pipe'],
    ...(o.uid !== undefined ? { uid: o.uid } : {}),
    ...(o.gid !== undefined ? { gid: o.gid } : {}),
  });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
  return {
    output: () => out,
    url: () => waitFor('listen url', () => /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(out)?.[1], 60_000),
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 15_000);
      const code = await exited;
      clearTimeout(t);
      return code;
    },
  };
}

export async function readyz(url: string): Promise<{ status: number; body: string }> {
  const res = await fetch(`${url}/readyz`);
  return { status: res.status, body: await res.text() };
}
