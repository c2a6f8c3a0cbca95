// Runs `vmseed …` in-process through main(), capturing its streams, so CLI
// tests exercise the real command table without spawning Node.
import { PassThrough, Readable } from 'node:stream';
import { main } from '../../src/main.ts';

export interface CliRun {
  code: number;
  out: Buffer;
  err: string;
}

export async function runCli(
  argv: string[],
  cwd: string,
  options: { stdin?: string; env?: NodeJS.ProcessEnv } = {},
): Promise<CliRun> {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  stdout.on('data', (c: Buffer) => out.push(c));
  stderr.on('data', (c: Buffer) => err.push(c));
  const code = await main(argv, {
    stdout,
    stderr,
    stdin: Readable.from([Buffer.from(options.stdin ?? '')]),
    env: options.env ?? {},
    cwd,
    stopSignal: new AbortController().signal,
  });
  return { code, out: Buffer.concat(out), err: Buffer.concat(err).toString() };
}
