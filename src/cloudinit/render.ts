// VMI + referenced objects → Seed. Pure: references come through RefResolver.
// First which input API builds the seed (or why none does here); that API's
// reader turns its fields into a SeedInput, and one composition
// (compose-seed.ts) turns any SeedInput into the seed. KubeVirt IMDS's
// annotations have their own small seed (annotation/imds-annotations.ts).
import { VmseedError } from '../errors.ts';
import { ANNOTATION } from './annotation/annotation.ts';
import { applyChangePolicy } from './change-policy.ts';
import { readAnnotationInput } from './annotation/annotation-input.ts';
import { composeSeed } from './compose-seed.ts';
import { isImdsEnabled, renderImdsSeed } from './annotation/imds-annotations.ts';
import type { RefResolver, VmiObject } from '../api/objects.ts';
import { firstCloudInitVolume, readVolumeInput, type CloudInitVolume } from './kubevirt/volume-input.ts';
import { ADOPTED_ANNOTATION, ADOPT_ANNOTATION, readAdopted, restoreAdopted } from './kubevirt/adopted.ts';
import { SeedBudget } from './limits.ts';
import { memoize } from './refs/memo-resolver.ts';
import type { RenderContext, RenderOptions } from './render-options.ts';
import type { Seed, SeedWarning } from './seed.ts';

export { DEFAULT_RENDER_OPTIONS, type RenderContext, type RenderOptions } from './render-options.ts';

/** A render's answer: the seed, or why vmseed builds none for this VMI (with a warning to surface, if any). */
export type RenderOutcome = { kind: 'seed'; seed: Seed } | { kind: 'skip'; reason: string; warning?: SeedWarning };

type Route =
  | { kind: 'imds' }
  | { kind: 'annotation'; text: string }
  // `vmi`: the VMI the volume is read with (an adopted volume's VMI as submitted).
  | { kind: 'volume'; volume: CloudInitVolume; vmi: VmiObject }
  | Extract<RenderOutcome, { kind: 'skip' }>;

/**
 * VMI + referenced objects → seed, or a skip. Reads only through `resolver` (memoized for this
 * render). Throws VmseedError: terminal for what the VMI must fix (KUBEVIRT_VOLUME_CONFLICT when
 * annotation and volume are both vmseed's), retryable for missing references or a busy worker.
 */
export async function renderSeed(
  vmi: VmiObject,
  resolver: RefResolver,
  options: RenderOptions,
  context: RenderContext = {},
): Promise<RenderOutcome> {
  // A per-render memo of referenced objects (refs/memo-resolver.ts).
  const refs = memoize(resolver);
  const route = routeVmi(vmi, options);
  if (route.kind === 'skip') return route;
  if (route.kind === 'imds') return { kind: 'seed', seed: await renderImdsSeed(vmi, refs, options, context.reportUrl) };
  const budget = new SeedBudget(options);
  const source = route.kind === 'volume' ? route.vmi : vmi;
  const input =
    route.kind === 'annotation'
      ? await readAnnotationInput(vmi, route.text, refs, budget, options)
      : await readVolumeInput(source, route.volume, refs);
  const seed = await composeSeed(source, input, refs, budget, options, context);
  return { kind: 'seed', seed: applyChangePolicy(source, seed) };
}

// Which input API builds this VMI's seed here, or why none does.
function routeVmi(vmi: VmiObject, options: RenderOptions): Route {
  const text = vmi.metadata.annotations?.[ANNOTATION];
  const volume = firstCloudInitVolume(vmi);
  const adopted = vmi.metadata.annotations?.[ADOPTED_ANNOTATION];
  if (adopted !== undefined) return adoptedRoute(vmi, adopted, text, volume);
  // KubeVirt IMDS's annotations; a volume KubeVirt builds coexists with
  // them as it does with IMDS's sidecar.
  if (text === undefined && isImdsEnabled(vmi) && (!volume || options.kubevirtVolumes === 'ignore')) {
    return { kind: 'imds' };
  }
  if (text !== undefined && volume) return volumeConflict(volume, options);
  if (text !== undefined) return { kind: 'annotation', text };
  if (!volume) return { kind: 'skip', reason: `no ${ANNOTATION} annotation and no cloud-init volume` };
  if (options.kubevirtVolumes === 'ignore') {
    const reason = `cloud-init volume "${volume.name}" is built by KubeVirt (kubevirt-volumes=ignore)`;
    // Asked for adoption and still holding its volume: the webhook left it
    // to KubeVirt (it said why at the creation) or did not answer.
    if (vmi.metadata.annotations?.[ADOPT_ANNOTATION] === 'true') {
      const message =
        `VMI asks for the adoption of its cloud-init volume "${volume.name}" (${ADOPT_ANNOTATION}), but it still has it, ` +
        "so KubeVirt builds it: the webhook said why in the creation's warnings, or did not answer (not installed, or not reachable)";
      return {
        kind: 'skip',
        reason,
        warning: { code: 'ADOPTION_SKIPPED', message, field: `spec.volumes[${volume.index}]` },
      };
    }
    return { kind: 'skip', reason };
  }
  return { kind: 'volume', volume, vmi };
}

// A volume the webhook adopted: built here whatever --kubevirt-volumes says,
// since KubeVirt no longer has it. A cloud-init volume still in the spec
// beside the record means KubeVirt builds that one; vmseed then builds none.
function adoptedRoute(vmi: VmiObject, text: string, annotation: string | undefined, volume?: CloudInitVolume): Route {
  if (annotation !== undefined) {
    throw new VmseedError(
      'ADOPTED_INVALID',
      `VMI has both the ${ADOPTED_ANNOTATION} and the ${ANNOTATION} annotations; remove the one you did not mean`,
      { kind: 'terminal', field: ADOPTED_ANNOTATION },
    );
  }
  if (volume) {
    const message =
      `VMI has the ${ADOPTED_ANNOTATION} annotation and still the cloud-init volume "${volume.name}"; ` +
      'KubeVirt builds that volume, so vmseed builds none. Remove the annotation';
    return {
      kind: 'skip',
      reason: `adopted annotation beside the cloud-init volume "${volume.name}"; KubeVirt builds the volume`,
      warning: { code: 'KUBEVIRT_VOLUME_CONFLICT', message, field: ADOPTED_ANNOTATION },
    };
  }
  const record = readAdopted(text);
  const submitted = restoreAdopted(vmi, record);
  const restored = firstCloudInitVolume(submitted);
  // The record's volume is first unless the submitted VMI had another
  // before it, which KubeVirt would have taken: the webhook never adopts
  // that one, so such a record was not written by it.
  if (!restored || restored.name !== record.volume.name)
    throw new VmseedError(
      'ADOPTED_INVALID',
      `annotation ${ADOPTED_ANNOTATION}: the adopted volume "${record.volume.name}" would not be the VMI's first cloud-init volume`,
      { kind: 'terminal', field: ADOPTED_ANNOTATION },
    );
  return { kind: 'volume', volume: restored, vmi: submitted };
}

// The annotation beside a cloud-init volume: two seed disks make cloud-init
// pick one at random, so neither is built by vmseed.
function volumeConflict(volume: CloudInitVolume, options: RenderOptions): Route {
  const field = `spec.volumes[${volume.index}]`;
  const message =
    `VMI has both the ${ANNOTATION} annotation and the cloud-init volume "${volume.name}"; two seed disks make ` +
    'cloud-init pick one at random. Remove the annotation or the volume';
  if (options.kubevirtVolumes === 'ignore') {
    return {
      kind: 'skip',
      reason: 'annotation and KubeVirt cloud-init volume both present; KubeVirt builds the volume',
      warning: { code: 'KUBEVIRT_VOLUME_CONFLICT', message, field },
    };
  }
  throw new VmseedError('KUBEVIRT_VOLUME_CONFLICT', message, { kind: 'terminal', field });
}
