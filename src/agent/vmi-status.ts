// The status shown for a VMI, computed from what a reconcile concluded and
// the status shown before: a pure function, so the store writes it once per
// reconcile (copy, compute, compare, write).
import type { Datasource } from '../api/objects.ts';
import type { AdoptedInfo, SchemaWarningInfo } from '../status/snapshot.ts';
import type { ErrorCode, ErrorKind } from '../errors.ts';
import type { StatusProblem, VmiStatusRecord } from '../status/snapshot.ts';

/** A problem as the reconcile found it; the status store stamps when it was shown. */
export interface Problem {
  code: ErrorCode;
  message: string;
  kind?: ErrorKind;
  field?: string;
  // A cloud-init schema problem's place and kind (cloudinit/seed.ts).
  schema?: SchemaWarningInfo;
}

export type StatusReport =
  // Seen, not reconciled yet: a new object starts pending, a known one keeps
  // its status. What the object itself says (its adopted volume) is shown
  // from then on.
  | { kind: 'seen'; adopted?: AdoptedInfo }
  | { kind: 'skipped'; warnings: Problem[] }
  // Served over HTTP only: no image, so nothing of an earlier image's record may linger.
  | { kind: 'served'; datasource: Datasource; warnings: Problem[] }
  | {
      kind: 'ready';
      datasource: Datasource;
      imagePath: string;
      imageBytes: number;
      contentHash: string;
      generatedAt: string | undefined;
      generationSeconds: number;
      files: Array<{ path: string; size: number }>;
      injection: VmiStatusRecord['injection'];
      warnings: Problem[];
    }
  | { kind: 'error'; problem: Problem; retries: number }
  // Waiting for what a VM's start normally brings (its launcher pod, its
  // libvirt, the domain, KubeVirt's pause) or for the cluster component to
  // come back: pending, the reason shown, no error counted.
  | { kind: 'waiting'; problem: Problem; retries: number };

export function nextStatus(
  prev: VmiStatusRecord | undefined,
  key: string,
  uid: string,
  report: StatusReport,
  at: string,
): VmiStatusRecord {
  return mergeStatus(prev, key, uid, patchOf(report, at));
}

// `patch` over the status of the same object (a new object starts pending);
// an undefined value in it removes the field.
export function mergeStatus(
  prev: VmiStatusRecord | undefined,
  key: string,
  uid: string,
  patch: Partial<VmiStatusRecord>,
): VmiStatusRecord {
  const [namespace, name] = splitKey(key);
  const base: VmiStatusRecord =
    prev && prev.uid === uid ? prev : { namespace, name, uid, state: 'pending', warnings: [], retries: 0 };
  const next: VmiStatusRecord = { ...base, ...patch };
  for (const [k, v] of Object.entries(patch))
    if (v === undefined) delete (next as unknown as Record<string, unknown>)[k];
  return next;
}

function patchOf(report: StatusReport, at: string): Partial<VmiStatusRecord> {
  const shown = (p: Problem): StatusProblem => ({ ...p, at });
  switch (report.kind) {
    case 'seen':
      return { adopted: report.adopted };
    case 'skipped':
      return {
        state: 'skipped',
        warnings: report.warnings.map(shown),
        lastError: undefined,
        retries: 0,
        retryAt: undefined,
        datasource: undefined,
        imagePath: undefined,
      };
    case 'served':
      return {
        state: report.warnings.length > 0 ? 'warning' : 'ready',
        datasource: report.datasource,
        imagePath: undefined,
        imageBytes: undefined,
        contentHash: undefined,
        generatedAt: undefined,
        generationSeconds: undefined,
        files: undefined,
        injection: undefined,
        lastError: undefined,
        warnings: report.warnings.map(shown),
        retries: 0,
        retryAt: undefined,
      };
    case 'ready': {
      const { kind: _, warnings, ...image } = report;
      return {
        state: warnings.length > 0 ? 'warning' : 'ready',
        ...image,
        lastError: undefined,
        warnings: warnings.map(shown),
        retries: 0,
        retryAt: undefined,
      };
    }
    // The queue says when it runs again once it has backed the key off
    // (StatusStore.backoff): until then no retry time is claimed.
    case 'error':
      return { state: 'error', lastError: shown(report.problem), retries: report.retries, retryAt: undefined };
    case 'waiting':
      return { state: 'pending', lastError: shown(report.problem), retries: report.retries, retryAt: undefined };
  }
}

export function splitKey(key: string): [string, string] {
  const i = key.indexOf('/');
  return i < 0 ? ['', key] : [key.slice(0, i), key.slice(i + 1)];
}
