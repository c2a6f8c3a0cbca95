// A seed's documents checked against cloud-init's schemas (check.ts), as the
// seed's warnings: one per problem, one per document or part not checked, a
// summary past MAX_PROBLEMS. The check is advice: whatever goes wrong in it
// (the worker pool full, a schema file unreadable, a bug) is a warning too,
// never a failed seed.
import type { VmiObject } from '../../api/objects.ts';
import type { Offload } from '../pure-ops.ts';
import type { RenderOptions } from '../render-options.ts';
import type { SeedWarning } from '../seed.ts';
import type { LocatedProblem, SchemaCheckRequest, SchemaReport, UncheckedPart } from './check.ts';
import type { CiProfile } from './ci-validator.ts';
import { releaseAnnotation } from './release-annotation.ts';
import { schemaStore } from './schema-store.ts';

/** The documents checked: NoCloud network-config only (ConfigDrive's network_data.json is OpenStack's format). */
export interface SchemaDocuments {
  userData?: Uint8Array;
  vendorData?: Uint8Array;
  networkConfig?: Uint8Array;
}

/** The release a VMI's seed is checked against, or undefined for none, with the annotation's warning. */
export function schemaRelease(
  vmi: VmiObject,
  options: RenderOptions,
): { release?: CiProfile; warnings: SeedWarning[] } {
  const check = options.schemaCheck;
  if (!check || check.release === 'off') return { warnings: [] };
  const choice = releaseAnnotation(vmi);
  switch (choice.kind) {
    case 'off':
      return { warnings: [] };
    case 'release':
      return { release: choice.release, warnings: [] };
    case 'unknown':
      return { release: check.release, warnings: [choice.warning] };
    case 'default':
      return { release: check.release, warnings: [] };
  }
}

/** The schema warnings of a seed's final documents; [] when the check is off. */
export async function schemaWarnings(
  vmi: VmiObject,
  options: RenderOptions,
  docs: SchemaDocuments,
  offload: Offload,
): Promise<SeedWarning[]> {
  const { release, warnings } = schemaRelease(vmi, options);
  const check = options.schemaCheck;
  if (!release || !check) return warnings;
  const req: SchemaCheckRequest = {
    dir: check.dir,
    release,
    // The node's Events and status page are read by others than the VMI's owner.
    reveal: false,
    ...(docs.userData?.length ? { userData: docs.userData } : {}),
    ...(docs.vendorData?.length ? { vendorData: docs.vendorData } : {}),
    ...(docs.networkConfig?.length ? { networkConfig: docs.networkConfig } : {}),
  };
  const bytes = (req.userData?.length ?? 0) + (req.vendorData?.length ?? 0) + (req.networkConfig?.length ?? 0);
  if (bytes === 0) return warnings;
  if (check.deferCold && !schemaStore(check.dir).isWarm(release) && check.deferCold(vmi, release)) return warnings;
  let report: SchemaReport;
  try {
    report = await offload.run('checkSchemas', [req], bytes, options.signal);
  } catch (e) {
    // Stopping is not a failed check: the render ends as a whole.
    if (options.signal?.aborted) throw e;
    const code = (e as { code?: unknown }).code;
    const why = typeof code === 'string' ? code : e instanceof Error ? e.name : 'error';
    check.warn?.(
      { namespace: vmi.metadata.namespace, name: vmi.metadata.name, release, code: why },
      'cloud-init schema check failed; the seed is written unchecked',
    );
    return [
      ...warnings,
      {
        code: 'CLOUDCONFIG_UNCHECKED',
        message: `the seed was not checked against cloud-init ${release}'s schemas: the check failed (${why}); the seed is written as it is`,
      },
    ];
  }
  return [...warnings, ...reportWarnings(report)];
}

/** "user-data", "user-data part 2 (x.yaml)". */
function placeOf(p: { document: string; part?: string }): string {
  return p.part ? `${p.document} ${p.part}` : p.document;
}

/** One warning per problem and per unchecked part, and a summary of the problems past the bound. */
export function reportWarnings(report: SchemaReport): SeedWarning[] {
  const out: SeedWarning[] = report.problems.map((p) => problemWarning(p, report.release));
  if (report.omitted > 0) {
    out.push({
      code: 'CLOUDCONFIG_SCHEMA',
      message:
        `${report.omitted} more cloud-init ${report.release} schema problems are not listed; ` +
        'fix those listed, or run `cloud-init schema --system` in the guest to see them all',
    });
  }
  // A template is rendered in the guest; not checking it is no problem of the VMI's.
  for (const u of report.unchecked) if (u.code !== 'SCHEMA_TEMPLATE') out.push(uncheckedWarning(u, report.release));
  return out;
}

function problemWarning(p: LocatedProblem, release: CiProfile): SeedWarning {
  const at = p.path === '' ? '(document)' : p.path;
  return {
    code: p.severity === 'error' ? 'CLOUDCONFIG_SCHEMA' : 'CLOUDCONFIG_DEPRECATED',
    message: `${placeOf(p)}: ${at}: ${p.message} (cloud-init ${release}, ${p.module})`,
    schema: {
      document: p.document,
      ...(p.part ? { part: p.part } : {}),
      path: p.path,
      module: p.module,
      severity: p.severity,
      release,
    },
  };
}

function uncheckedWarning(u: UncheckedPart, release: CiProfile): SeedWarning {
  return {
    code: u.code === 'SCHEMA_BUDGET_EXCEEDED' ? 'CLOUDCONFIG_SCHEMA_BUDGET' : 'CLOUDCONFIG_UNCHECKED',
    message: `${placeOf(u)}: not checked against cloud-init ${release}'s schema: ${u.reason}`,
  };
}
