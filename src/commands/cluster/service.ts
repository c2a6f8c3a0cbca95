// What each service of the cluster component is to `vmseed cluster`: a
// listener it started, a readiness check for /readyz, and a close.
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import type { ClusterConfig } from '../../config/cluster-config.ts';
import type { Metrics } from '../../metrics/metrics.ts';

/** A running service of `vmseed cluster`. */
export interface ClusterService {
  // For the log and the start-up error.
  readonly name: string;
  readonly address: AddressInfo;
  // Why it cannot serve now (only this component's /readyz fails), or undefined.
  readiness?: () => string | undefined | Promise<string | undefined>;
  close(): Promise<void>;
}

/** Starts one service from the configuration; throws (naming its flag) when it cannot. */
export type StartService = (config: ClusterConfig, logger: Logger, metrics: Metrics) => Promise<ClusterService>;
