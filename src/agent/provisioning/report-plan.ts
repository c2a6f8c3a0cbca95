// Whether a VMI's seed asks cloud-init to post its progress to this node,
// and where: the report URL (src/datasource/reports/report-token.ts) under the datasource's
// base URL, with a credential bound to the VMI's UID. It needs the listener
// the events go to and a key to sign with; without either, or when the
// operator or the VMI opts out, the reason is what the status page shows.
import type { VmiObject } from '../../api/objects.ts';
import { REPORT_PROGRESS_ANNOTATION, reportProgressWanted } from '../../cloudinit/userdata/reporting-config.ts';
import type { DatasourceKeyring } from '../../datasource/tokens.ts';
import { reportToken, reportUrl } from '../../datasource/reports/report-token.ts';

/** Where a VMI's seed tells cloud-init to post its progress, or why it does not. */
export type ReportPlan = { url: string } | { reason: string };
/**
 * Plans a VMI's progress reporting at each render (`uid`: the object's, which
 * the report credential is bound to).
 */
export type ReportPlanner = (vmi: VmiObject, uid: string) => ReportPlan;

export interface ProgressReportOptions {
  // --report-progress.
  enabled: boolean;
  // The NoCloud HTTP datasource, when it is on: its (reloaded) keyring and
  // the base URL guests reach it at.
  datasource?: { keyring: DatasourceKeyring; baseUrl: string };
}

export const REPORT_PROGRESS_FLAG = '--report-progress';

/**
 * The ReportPlanner of this node: a signed report URL when reporting is on, the
 * VMI does not opt out and the datasource has a key loaded, else the reason.
 */
export function progressReportPlanner(o: ProgressReportOptions): ReportPlanner {
  return (vmi, uid) => {
    if (!o.enabled) return { reason: `progress reporting is off on this node (${REPORT_PROGRESS_FLAG}=false)` };
    if (!reportProgressWanted(vmi))
      return { reason: `the VMI opts out (annotation ${REPORT_PROGRESS_ANNOTATION}: "false")` };
    if (!o.datasource)
      return {
        reason:
          'the NoCloud HTTP datasource is off (--datasource-listen), so cloud-init has nowhere to post its progress',
      };
    // Read at each render: the key file is reloaded when it changes.
    if (o.datasource.keyring.size === 0)
      return {
        reason:
          'no datasource key is loaded (--datasource-key-file missing or empty), so no report credential can be made',
      };
    return { url: reportUrl(o.datasource.baseUrl, reportToken(o.datasource.keyring, uid)) };
  };
}
