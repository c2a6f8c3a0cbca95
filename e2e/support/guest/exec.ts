// Small promise wrappers around child processes for fixture builds: argument
// arrays only (no shell unless a pipeline is really needed), bounded time.
import { execFile } from 'node:child_process';

export interface RunResult {
  stdout: string;
  stderr: string;
}

export function run(
  file: string,
  args: readonly string[],
  opts: { cwd?: string; timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    execFile(
      file,
      args,
      {
        cwd: opts.cwd,
        env: opts.env ?? process.env,
        timeout: opts.timeoutMs ?? 120_000,
        killSignal: 'SIGKILL',
        maxBuffer: 64 * 1024 * 1024,
        encoding: 'utf8',
      },
      (err, stdout, stderr) => {
        if (err) {
          const why = err.killed ? `killed after ${opts.timeoutMs ?? 120_000} ms` : `exit ${err.code}`;
          reject(new Error(`${file} ${args.join(' ')} failed (${why}): ${String(stderr).slice(-2000)}`));
          return;
        }
        resolve({ stdout, stderr });
      },
    );
  });
}

/** Runs a fixed shell pipeline; inputs reach it through positional arguments, never interpolation. */
export function sh(
  script: string,
  args: readonly string[] = [],
  opts: { cwd?: string; timeoutMs?: number } = {},
): Promise<RunResult> {
  return run('/bin/sh', ['-ec', script, 'sh', ...args], opts);
}
