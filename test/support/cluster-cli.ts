// `vmseed cluster` (`src/main.ts cluster …`) as a child process, for tests
// of its listeners: the webhook and the probes on ephemeral loopback ports
// (read back from its start-up log line), output collected, stopped with
// SIGTERM (SIGKILL after 15 s).
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { waitFor } from './agent-harness.ts';

const ROOT = new URL('../../', import.meta.url).pathname;

export interface CliCluster {
  output(): string;
  // http://127.0.0.1:PORT of /healthz, /readyz, /metrics.
  probeUrl(): Promise<string>;
  webhookPort(): Promise<number>;
  stop(): Promise<number | null>;
}

export function startCliCluster(args: string[], o: { env?: Record<string, string> } = {}): CliCluster {
  const child = spawn(
    process.execPath,
    [join(ROOT, 'src/main.ts'), 'cluster', '--webhook-listen', '127.0.0.1:0', '--probe-listen', '127.0.0.1:0', ...args],
    { env: { ...process.env, ...o.env }, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
  return {
    output: () => out,
    probeUrl: () =>
      waitFor(
        'probe listener',
        () => {
          const m = /"probes":"(127\.0\.0\.1:\d+)"/.exec(out);
          return m ? `http://${m[1]}` : undefined;
        },
        60_000,
      ),
    webhookPort: () =>
      waitFor(
        'webhook listener',
        () => {
          const m = /"webhook":"127\.0\.0\.1:(\d+)"/.exec(out);
          return m ? Number(m[1]) : undefined;
        },
        60_000,
      ),
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 15_000);
      const code = await exited;
      clearTimeout(t);
      return code;
    },
  };
}
