// The identity checks' budget, judged one way in every bench that runs the
// datasource with and without launcher knowledge side by side: per-request
// CPU of the server's own thread, one sample per row, the two servers' rows
// of a round run at once or back to back (which first alternating round by
// round), so that a drift of the machine (other work on its cores,
// frequency, GC debt) falls on both. A single row says little on a shared
// machine. The ratio of the two servers' medians over the rounds is shown,
// but what is judged is the median over the rounds of each round's own
// ratio: a pair's rows ran together, so the machine's drift from one round
// to the next (±20 % on a shared 2-core machine) cancels within a pair,
// while the two medians may come from different rounds and keep it.
import { quantile } from '../stats.ts';

/** What the identity checks may add to today's per-request CPU: 5 %. */
export const IDENTITY_CPU_BUDGET = 0.05;

/**
 * Which of the two servers runs first in a round's slot: alternating round
 * by round and slot by slot (A B, B A; B A, A B ...), so neither always
 * follows the other.
 */
export function pairOrder(round: number, slot: number): [0, 1] | [1, 0] {
  return (round + slot) % 2 === 0 ? [0, 1] : [1, 0];
}

/**
 * One load's samples: server-thread CPU µs per request answered, one per
 * row, in round order, for the server without launcher knowledge (`none`)
 * and with the identity checks (`checked`).
 */
export interface IdentitySamples {
  load: string;
  none: number[];
  checked: number[];
}

// Each round's ratio, identity checks over none.
function pairedRatios(s: IdentitySamples): number[] {
  return s.checked.map((c, i) => c / s.none[i]);
}

function medianRatio(s: IdentitySamples): number {
  return quantile(s.checked, 0.5) / quantile(s.none, 0.5);
}

// The judged figure: the median over the rounds of each round's ratio.
function pairedMedian(s: IdentitySamples): number {
  return quantile(pairedRatios(s), 0.5);
}

/**
 * The comparison's table (median and p99 across rounds for both servers,
 * the ratio of medians, the paired rounds' spread) and the verdict line.
 */
export function identityVerdict(samples: IdentitySamples[]): string[] {
  if (samples.length === 0) return [];
  const f = (x: number) => x.toFixed(1);
  const out = [
    '| load | rounds | no launcher knowledge µs/request median | p99 | identity checks µs/request median | p99 | ratio of medians | paired rounds: median ratio (middle half) |',
    '|---|---|---|---|---|---|---|---|',
  ];
  for (const s of samples) {
    const ratio = medianRatio(s);
    const paired = pairedRatios(s);
    out.push(
      `| ${s.load} | ${Math.min(s.none.length, s.checked.length)} | ${f(quantile(s.none, 0.5))} | ${f(quantile(s.none, 0.99))} | ${f(quantile(s.checked, 0.5))} | ${f(quantile(s.checked, 0.99))} | ${ratio.toFixed(3)}x | ${quantile(paired, 0.5).toFixed(3)}x (${quantile(paired, 0.25).toFixed(3)}–${quantile(paired, 0.75).toFixed(3)}) |`,
    );
  }
  const worst = samples.reduce((w, s) => (pairedMedian(s) > pairedMedian(w) ? s : w));
  const added = (pairedMedian(worst) - 1) * 100;
  const met = added <= IDENTITY_CPU_BUDGET * 100;
  out.push(
    '',
    `Verdict: identity checks add ≤ ${IDENTITY_CPU_BUDGET * 100} % per-request CPU: ${met ? 'MET' : 'NOT MET'} (largest: ${worst.load}, ${added >= 0 ? '+' : ''}${added.toFixed(1)} % by the median of the paired rounds' ratios; ratio of medians ${medianRatio(worst).toFixed(3)}x)`,
  );
  // A verdict is only as good as the noise under it: say so when the
  // rounds disagree by more than the budget itself.
  for (const s of samples) {
    const paired = pairedRatios(s);
    const spread = quantile(paired, 0.75) - quantile(paired, 0.25);
    if (spread > IDENTITY_CPU_BUDGET)
      out.push(
        `Noise: ${s.load}: the paired rounds' middle half spans ${(spread * 100).toFixed(1)} %, more than the budget; more rounds would narrow the median`,
      );
  }
  return out;
}
