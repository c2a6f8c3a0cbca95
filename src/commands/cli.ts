// What every subcommand gets: its arguments and the process's streams, so
// commands can be run in-process by tests without touching `process`.
import type { Readable, Writable } from 'node:stream';

/**
 * What every subcommand gets: its arguments and the process's streams, so tests
 * run commands in-process without touching `process`.
 */
export interface CliContext {
  argv: string[];
  stdout: Writable;
  stderr: Writable;
  stdin: Readable;
  env: NodeJS.ProcessEnv;
  cwd: string;
  // Aborted when the process is asked to stop (SIGTERM/SIGINT). Long-running
  // commands (the agent) race their work against it.
  stopSignal: AbortSignal;
}

/** Exit codes: 0 success, 1 failure at run time, 2 bad input or usage. */
export type ExitCode = 0 | 1 | 2;

/** A subcommand of `vmseed`, loaded on demand by main.ts: resolves to the process's exit code. */
export type Command = (ctx: CliContext) => Promise<ExitCode>;

export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}
