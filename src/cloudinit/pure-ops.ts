// The synchronous, CPU-heavy steps of a render (YAML parse, measure, merge,
// serialise), by name, with structured-clonable arguments and results, so
// render.ts can run each one in this thread or in a worker thread
// (src/agent/render-pool.ts runs this same table there). A 1 MiB document of
// one-line keys is one long synchronous block to check and a far longer one
// to merge and serialise (`npm run bench:hostile`, rows dense-userdata-1mib
// and dense-userdata-merge-1mib): inline, one such render would stall every
// other VMI, the probes and the datasource listener for that long.
import { parseAnnotation } from './annotation/annotation.ts';
import { SeedBudget, type BudgetSnapshot } from './limits.ts';
import { chooseNetworkConfig } from './network/choose.ts';
import { checkSchemas } from './schema/check.ts';
import { composeUserData, type ComposedUserData, type UserDataParts } from './userdata/compose.ts';
import { bootstrapSentinel } from './userdata/bootstrap-sentinel.ts';
import { lintUserData } from './userdata/user-data-lint.ts';
import { lintVendorData } from './userdata/vendor-data.ts';

// composeUserData against a copy of the render's budget; the caller adopts
// the copy's counters afterwards.
function composeWithBudget(
  parts: Omit<UserDataParts, 'budget'>,
  budget: BudgetSnapshot,
): { composed: ComposedUserData | undefined; budget: BudgetSnapshot } {
  const b = SeedBudget.fromSnapshot(budget);
  const composed = composeUserData({ ...parts, budget: b });
  return { composed, budget: b.snapshot() };
}

export const PURE_OPS = Object.freeze({
  parseAnnotation,
  lintUserData,
  lintVendorData,
  chooseNetworkConfig,
  composeUserData: composeWithBudget,
  checkSchemas,
  bootstrapSentinel,
});

export type PureOps = typeof PURE_OPS;
/** The name of a heavy render step an Offload can run: a key of PURE_OPS. */
export type PureOpName = keyof PureOps;
/** Step K's arguments, structured-clonable so they can cross to a worker. */
export type PureArgs<K extends PureOpName> = PureOps[K] extends (...args: infer A) => unknown ? A : never;
/** Step K's result, structured-clonable so it can come back from a worker. */
export type PureResult<K extends PureOpName> = PureOps[K] extends (...args: never[]) => infer R ? R : never;

/**
 * Where a render runs its heavy steps. `bytes` is the size of the document the step works on, for
 * the runner to choose: a worker round trip costs more than a small document's step
 * (docs/threat-model.md, "Measured"), so small documents stay in the caller's thread.
 */
export interface Offload {
  run<K extends PureOpName>(op: K, args: PureArgs<K>, bytes: number, signal?: AbortSignal): Promise<PureResult<K>>;
}

/** Runs step `op` synchronously in this thread (inline, or inside a worker); throws what the step throws. */
export function runPure<K extends PureOpName>(op: K, args: PureArgs<K>): PureResult<K> {
  return (PURE_OPS[op] as unknown as (...a: unknown[]) => unknown)(...args) as PureResult<K>;
}

/** Runs every step in the caller's thread (the CLI, tests, and the default). */
export const INLINE_OFFLOAD: Offload = {
  // async so that a step's throw is a rejection, as it is from a worker.
  run: async (op, args) => runPure(op, args),
};
