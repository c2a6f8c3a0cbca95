// Leaving the process once a command has returned, even when something it
// gave up on (a reconcile past its stop deadline) still holds the event
// loop. process.exit() is not enough when a thread-pool request is stuck
// (a read of a FIFO blocks in open(2) until a writer comes): Node's exit
// path joins the libuv pool threads (uv_library_shutdown) and waits for
// that request forever. Then the only way out is a fatal signal: SIGTERM
// with its default action, which is what the kubelet would send anyway.

/**
 * What forceExit does to the process; processExitDeps gives the real ones,
 * tests hand in fakes.
 */
export interface ExitDeps {
  // process.getActiveResourcesInfo(): what still holds the loop.
  activeResources(): string[];
  // One JSON log line (the agent's logs are JSON lines).
  log(line: string): void;
  exit(code: number): void;
  // Re-raise SIGTERM with its default action (exit status 128+15).
  terminate(): void;
}

/**
 * How the process will leave: process.exit(code), or SIGTERM when exit would
 * hang; `pending`: the resources still holding the loop.
 */
export type ExitPlan = { how: 'exit'; code: number; pending: string[] } | { how: 'signal'; pending: string[] };

// Handles that are not work: stdio, and the timer that calls us.
const NOT_WORK = new Set(['TTYWrap', 'PipeWrap', 'Timeout', 'Immediate']);

/**
 * The exit plan for these active resources: a stuck file-system request
 * (`FSReq*`) means SIGTERM, since process.exit would wait for it forever.
 */
export function planExit(code: number, resources: string[]): ExitPlan {
  const pending = resources.filter((r) => !NOT_WORK.has(r));
  return pending.some((r) => r.startsWith('FSReq')) ? { how: 'signal', pending } : { how: 'exit', code, pending };
}

/**
 * Leaves the process now, with one warning log line naming what still held the
 * loop and why; main.ts calls it after its exit grace or on a second signal.
 */
export function forceExit(code: number, reason: string, deps: ExitDeps): ExitPlan {
  const plan = planExit(code, deps.activeResources());
  const counts: Record<string, number> = {};
  for (const r of plan.pending) counts[r] = (counts[r] ?? 0) + 1;
  deps.log(
    JSON.stringify({
      level: 40,
      time: Date.now(),
      component: 'main',
      reason,
      pending: counts,
      exit:
        plan.how === 'exit' ? plan.code : 'SIGTERM (a file-system request is stuck; process.exit would wait for it)',
      msg: 'exiting with work still pending',
    }),
  );
  if (plan.how === 'exit') deps.exit(plan.code);
  else deps.terminate();
  return plan;
}

/** The ExitDeps of this process (stderr, process.exit, a default-action SIGTERM). */
export function processExitDeps(): ExitDeps {
  return {
    activeResources: () => process.getActiveResourcesInfo(),
    log: (line) => process.stderr.write(line + '\n'),
    exit: (code) => process.exit(code),
    terminate: () => {
      process.removeAllListeners('SIGTERM');
      process.kill(process.pid, 'SIGTERM');
    },
  };
}
