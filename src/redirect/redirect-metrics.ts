// The redirect container's own metrics, in a registry of its own: it is a
// separate process (the agent's metrics reference does not list these).
import { Counter, Gauge, Registry } from 'prom-client';

/** The redirect container's metrics, in a registry of their own. */
export function createRedirectMetrics() {
  const registry = new Registry();
  return {
    registry,
    inPlace: new Gauge({
      name: 'vmseed_redirect_in_place',
      help: "1 when the last check found the 169.254.169.254 DNAT rule in vmseed's nftables table (and, with --datasource-key-file, its target answering as this node's datasource), else 0",
      registers: [registry],
    }),
    applies: new Counter({
      name: 'vmseed_redirect_applies_total',
      help: 'Times the redirect ruleset was loaded: at start, or because a check found it missing (flushed or replaced)',
      labelNames: ['reason'] as const,
      registers: [registry],
    }),
    errors: new Counter({
      name: 'vmseed_redirect_errors_total',
      help: 'nft runs that failed, by operation (apply, remove)',
      labelNames: ['operation'] as const,
      registers: [registry],
    }),
  };
}

export type RedirectMetrics = ReturnType<typeof createRedirectMetrics>;
