// The VMI annotation that picks the cloud-init release its seed is checked
// against (the guest image's, when it is not the node's default): '22.4',
// '25.1', or 'off' for no check. Anything else is a warning, never a failure:
// the check is advice, and the seed is the same with or without it.
import type { VmiObject } from '../../api/objects.ts';
import type { SeedWarning } from '../seed.ts';
import type { CiProfile } from './ci-validator.ts';
import { CLOUD_INIT_RELEASES } from './schema-store.ts';

/** The annotation naming a VMI's cloud-init release, or `off`. */
export const CLOUD_INIT_VERSION_ANNOTATION = 'vmseed.io/cloud-init-version';

/** What the annotation asks for: a release, off, the node's default (absent), or a warning (unknown value). */
export type ReleaseChoice =
  | { kind: 'default' }
  | { kind: 'release'; release: CiProfile }
  | { kind: 'off' }
  | { kind: 'unknown'; warning: SeedWarning };

const MAX_SHOWN = 40;

/** Reads the VMI's `vmseed.io/cloud-init-version` annotation. */
export function releaseAnnotation(vmi: VmiObject): ReleaseChoice {
  return releaseChoice(vmi.metadata.annotations?.[CLOUD_INIT_VERSION_ANNOTATION]);
}

/** What an annotation value asks for (the agent's render and the webhook read it alike). */
export function releaseChoice(raw: string | undefined): ReleaseChoice {
  if (raw === undefined || raw.trim() === '') return { kind: 'default' };
  const v = raw.trim();
  if (v === 'off') return { kind: 'off' };
  const release = CLOUD_INIT_RELEASES.find((r) => r === v);
  if (release) return { kind: 'release', release };
  const shown = v.length > MAX_SHOWN ? `${v.slice(0, MAX_SHOWN)}…` : v;
  const allowed = [...CLOUD_INIT_RELEASES, 'off'].map((r) => `"${r}"`).join(', ');
  return {
    kind: 'unknown',
    warning: {
      code: 'CLOUD_INIT_VERSION_UNKNOWN',
      field: `metadata.annotations.${CLOUD_INIT_VERSION_ANNOTATION}`,
      message:
        `annotation ${CLOUD_INIT_VERSION_ANNOTATION} is ${JSON.stringify(shown)}, not one of ${allowed}; ` +
        "the seed is checked against the node's default release instead: set it to the cloud-init release " +
        'of the guest image (the nearest one listed), "off" to skip the check, or remove it',
    },
  };
}
