// The identity checks' own work, apart from HTTP: the lookup every request
// on a token path makes (SeedIdentity.lookup: the token index, the launcher
// address, the directory entry), over the agent's AgentSeedDirectory with
// the launcher pods known and without, in this thread. On a shared machine
// a row of HTTP requests moves by more than the 5 % it is judged against;
// this moves by far less, so it says what the checks add in µs, which the
// HTTP rows' median per-request CPU turns into a share.
import type { Seed } from '../../src/cloudinit/seed.ts';
import { SeedIdentity } from '../../src/datasource/identity.ts';
import { DatasourceKeyring, signToken } from '../../src/datasource/tokens.ts';
import { benchDirectory } from '../imds-directory.ts';
import { quantile } from '../stats.ts';
import { pairOrder } from './identity-compare.ts';

const SEED: Seed = {
  datasource: 'nocloud',
  metaData: { 'instance-id': 'iid-0' },
  userData: new Uint8Array(0),
  vendorData: new Uint8Array(0),
  networkConfig: new Uint8Array(0),
  warnings: [],
};

/** The lookup's CPU per request, µs, one sample per round. */
export interface LookupCost {
  none: number[];
  checked: number[];
}

/**
 * Times `perRound` lookups (the bench VMIs' tokens in turn, each from its
 * own launcher address, every one answered) per server kind per round,
 * the kinds alternating which goes first.
 */
export function identityLookupCost(
  key: Uint8Array,
  vmis: number,
  ipOf: (i: number) => string,
  rounds = 15,
  perRound = 50_000,
): LookupCost {
  const keyring = new DatasourceKeyring([key]);
  const identities = [false, true].map(
    (launchers) =>
      new SeedIdentity(
        benchDirectory(vmis, () => SEED, launchers, ipOf),
        keyring,
        false,
      ),
  );
  const tokens = Array.from({ length: vmis }, (_, i) => signToken(key, `uid-${i}`));
  const sources = Array.from({ length: vmis }, (_, i) => ipOf(i));
  const time = (identity: SeedIdentity, n: number): number => {
    const before = process.threadCpuUsage();
    let answered = 0;
    for (let j = 0; j < n; j++) {
      const i = j % vmis;
      if (identity.lookup({ kind: 'token', token: tokens[i], file: 'meta-data' }, sources[i]) !== undefined) answered++;
    }
    const used = process.threadCpuUsage(before);
    // A lookup that answered nothing measured the wrong path.
    if (answered !== n) throw new Error(`identity lookup answered ${answered} of ${n}`);
    return (used.user + used.system) / n;
  };
  for (const identity of identities) time(identity, perRound);
  const out: LookupCost = { none: [], checked: [] };
  for (let round = 0; round < rounds; round++)
    for (const s of pairOrder(round, 0)) (s === 0 ? out.none : out.checked).push(time(identities[s], perRound));
  return out;
}

/**
 * The lookup's lines: its median cost either way, and what the difference
 * is of `perRequestUs`, the median per-request CPU without launcher
 * knowledge that the HTTP rows measured.
 */
export function lookupLines(load: string, cost: LookupCost, perRequestUs: number): string[] {
  const none = quantile(cost.none, 0.5);
  const checked = quantile(cost.checked, 0.5);
  const added = checked - none;
  return [
    `${load}: identity lookup alone, in process (${cost.none.length} rounds): ${none.toFixed(2)} µs without launcher knowledge, ${checked.toFixed(2)} µs with (p99 ${quantile(cost.none, 0.99).toFixed(2)} / ${quantile(cost.checked, 0.99).toFixed(2)}); added ${added.toFixed(2)} µs = ${((added / perRequestUs) * 100).toFixed(2)} % of the ${perRequestUs.toFixed(1)} µs per request measured over HTTP`,
  ];
}
