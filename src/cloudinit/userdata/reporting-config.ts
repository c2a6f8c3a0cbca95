// cloud-init's progress, reported to the node: a cloud-config that turns on
// cloud-init's webhook reporting handler (cloudinit/reporting/handlers.py
// WebHookHandler), carried in vendor-data so the user's user-data is never
// touched. cloud-init merges the instance's cloud-configs with user-data's
// over vendor-data's (helpers.ConfigMerger), so a user's own `reporting`
// keys win, `reporting: {vmseed: null}` removes the handler, and
// `vendor_data: {enabled: false}` drops it with the rest of vendor-data.
//
// cloud-init reads `reporting` from its merged configuration after it has
// consumed user-data and vendor-data (cmd/main.py apply_reporting_cfg), so
// on a first boot what is reported starts part-way through init-network;
// docs/progress-reporting.md says which events each release sends.
import { createHash } from 'node:crypto';
import type { VmiObject } from '../../api/objects.ts';
import { VmseedError } from '../../errors.ts';
import { detectUserDataKind } from './user-data-lint.ts';

/** A VMI's opt-out of progress reporting: "false" turns it off; unset or "true" keeps it. */
export const REPORT_PROGRESS_ANNOTATION = 'vmseed.io/report-progress';

// The handler's name in cloud-init's registry: what a user's user-data sets
// to null to turn it off.
export const REPORTING_HANDLER = 'vmseed';

// A post that cannot reach the node must not hold a stage for long: the
// handler's thread posts in the background, but cloud-init waits for its
// queue at the end of each stage (and drops the rest after three failures
// in a row). Seconds, as url_helper.readurl takes them.
export const REPORT_TIMEOUT_SECONDS = 5;
export const REPORT_RETRIES = 1;

/**
 * false when the VMI opts out; anything but "true"/"false" is refused (terminal ANNOTATION_INVALID),
 * as the other vmseed.io/ annotations are.
 */
export function reportProgressWanted(vmi: VmiObject): boolean {
  const value = vmi.metadata.annotations?.[REPORT_PROGRESS_ANNOTATION];
  if (value === undefined || value.trim() === '') return true;
  const v = value.trim();
  if (v === 'true' || v === 'false') return v === 'true';
  throw new VmseedError(
    'ANNOTATION_INVALID',
    `annotation ${REPORT_PROGRESS_ANNOTATION} is "${v.slice(0, 40)}"; use "false" to keep cloud-init from reporting its progress to the node, or "true"`,
    { kind: 'terminal', field: `metadata.annotations.${REPORT_PROGRESS_ANNOTATION}` },
  );
}

// The cloud-config part. JSON strings are YAML scalars, so the URL needs no
// YAML escaping of its own.
export function reportingCloudConfig(endpoint: string): string {
  return (
    '#cloud-config\n' +
    'reporting:\n' +
    `  ${REPORTING_HANDLER}:\n` +
    '    type: webhook\n' +
    `    endpoint: ${JSON.stringify(endpoint)}\n` +
    `    timeout: ${REPORT_TIMEOUT_SECONDS}\n` +
    `    retries: ${REPORT_RETRIES}\n`
  );
}

export type ReportingVendorData = { bytes: Uint8Array } | { reason: string };

/**
 * Vendor-data carrying the reporting part beside the VMI's own (`existing`, as the VMI or the
 * operator gave it). That goes first in a MIME multipart message, base64-encoded so its bytes reach
 * cloud-init as they are, in a part whose type makes cloud-init treat it as the whole of
 * vendor-data (user_data.py: text/x-not-multipart is typed by its first line; a gzip type is
 * decompressed first). A MIME message of the VMI's own is not rewritten: `reason` says why.
 */
export function withReportingPart(existing: Uint8Array | undefined, endpoint: string): ReportingVendorData {
  const part = reportingCloudConfig(endpoint);
  if (!existing || existing.length === 0) return { bytes: new Uint8Array(Buffer.from(part, 'utf8')) };
  const gzip = existing[0] === 0x1f && existing[1] === 0x8b;
  if (!gzip && detectUserDataKind(existing).kind === 'mime') {
    return {
      reason:
        "the VMI's vendor-data is a MIME multipart message, which vmseed does not rewrite; cloud-init's progress is not reported",
    };
  }
  const boundary = boundaryFor(existing);
  const ownType = gzip ? 'application/gzip' : 'text/x-not-multipart';
  const text =
    `Content-Type: multipart/mixed; boundary="${boundary}"\n` +
    'MIME-Version: 1.0\n' +
    '\n' +
    `--${boundary}\n` +
    `Content-Type: ${ownType}\n` +
    'MIME-Version: 1.0\n' +
    'Content-Transfer-Encoding: base64\n' +
    'Content-Disposition: attachment; filename="vendor-data"\n' +
    '\n' +
    `${base64Lines(existing)}\n` +
    `--${boundary}\n` +
    'Content-Type: text/cloud-config; charset="us-ascii"\n' +
    'MIME-Version: 1.0\n' +
    'Content-Transfer-Encoding: 7bit\n' +
    'Content-Disposition: attachment; filename="vmseed-reporting.cfg"\n' +
    '\n' +
    part +
    `--${boundary}--\n`;
  return { bytes: new Uint8Array(Buffer.from(text, 'utf8')) };
}

// Deterministic (the same input gives the same seed), and no line of the
// parts can be it: base64 has no "-", and the reporting part's only
// variable text is the endpoint, which a hash of the other part does not match.
function boundaryFor(existing: Uint8Array): string {
  return `==vmseed-${createHash('sha256').update(existing).digest('hex').slice(0, 32)}==`;
}

function base64Lines(bytes: Uint8Array): string {
  const b64 = Buffer.from(bytes).toString('base64');
  const lines: string[] = [];
  for (let i = 0; i < b64.length; i += 76) lines.push(b64.slice(i, i + 76));
  return lines.join('\n');
}
