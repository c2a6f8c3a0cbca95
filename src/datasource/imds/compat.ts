// KubeVirt IMDS compatibility on the HTTP side: IMDS guests carry the
// serial `ds=nocloud;s=http://169.254.169.254/v1/`, with no token, because
// IMDS's sidecar sits in the launcher pod's network namespace and trusts
// it. A node agent serves every pod on the node, so it needs another way to
// tell guests apart: the source address, which the node-level redirect
// (DNAT, src/redirect) keeps as the launcher pod's IP, matched against the
// VMI's launcher pod's IP where the node's pods are known
// (SeedDirectory.launcherAt), else against the addresses the VMI reports.
//
// This directory answers token-less requests for VMIs that opted in to
// IMDS only (their seed is delivery 'http'), so turning IMDS compatibility
// on does not expose every other VMI's seed to source-address guessing;
// token requests are unchanged. Without launcher pods, the weaknesses of
// source-address identity (documented at
// DatasourceServerOptions.compatSourceAddress) still apply to the opted-in
// VMIs: they are what IMDS users had, and the way out is a token serial
// (`vmseed seed-url`).
import type { DatasourceFile } from '../files.ts';
import type { SeedDirectory, SeedDirectoryEntry } from '../types.ts';

/**
 * `directory` with byAddress() narrowed to VMIs whose seed is delivered over
 * HTTP (IMDS opt-in); every other method passes through.
 */
export function imdsOnlySourceAddress(directory: SeedDirectory): SeedDirectory {
  return {
    get: (uid) => directory.get(uid),
    listUids: () => directory.listUids(),
    get revision() {
      return directory.revision;
    },
    byAddress(address: string): SeedDirectoryEntry | undefined {
      const e = directory.byAddress(address);
      return e?.seed.delivery === 'http' ? e : undefined;
    },
    ...(directory.launcherAt !== undefined ? { launcherAt: (address: string) => directory.launcherAt?.(address) } : {}),
    recordFetch: (namespace: string, name: string, file: DatasourceFile, at: Date) =>
      directory.recordFetch(namespace, name, file, at),
    recordSeededAfterBoot: (entry: SeedDirectoryEntry, missedAt: Date, servedAt: Date) =>
      directory.recordSeededAfterBoot?.(entry, missedAt, servedAt),
  };
}
