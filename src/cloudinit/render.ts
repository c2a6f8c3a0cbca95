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
  | { kind: 'volume'; volume: CloudInitVolume }
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
  const input =
    route.kind === 'annotation'
      ? await readAnnotationInput(vmi, route.text, refs, budget, options)
      : await readVolumeInput(vmi, route.volume, refs);
  const seed = await composeSeed(vmi, input, refs, budget, options, context);
  return { kind: 'seed', seed: applyChangePolicy(vmi, seed) };
}

// Which input API builds this VMI's seed here, or why none does.
function routeVmi(vmi: VmiObject, options: RenderOptions): Route {
  const text = vmi.metadata.annotations?.[ANNOTATION];
  const volume = firstCloudInitVolume(vmi);
  // KubeVirt IMDS's annotations; a volume KubeVirt builds coexists with
  // them as it does with IMDS's sidecar.
  if (text === undefined && isImdsEnabled(vmi) && (!volume || options.kubevirtVolumes === 'ignore')) {
    return { kind: 'imds' };
  }
  if (text !== undefined && volume) return volumeConflict(volume, options);
  if (text !== undefined) return { kind: 'annotation', text };
  if (!volume) return { kind: 'skip', reason: `no ${ANNOTATION} annotation and no cloud-init volume` };
  if (options.kubevirtVolumes === 'ignore') {
    return {
      kind: 'skip',
      reason: `cloud-init volume "${volume.name}" is built by KubeVirt (kubevirt-volumes=ignore)`,
    };
  }
  return { kind: 'volume', volume };
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
