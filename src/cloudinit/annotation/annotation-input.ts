// The `vmseed.io/cloud-init` annotation read into a seed input: the document
// parsed (pure-ops.ts, on a worker when the agent has them), the KubeVirt
// admission rules that apply to it, KubeVirt's data fields, SSH keys from
// accessCredentials and Virtlet's sshKeys, and the Virtlet/oVirt extras
// (extras-input.ts). vmseed's own API, so the composition is strict.
import type { SeedInput } from '../compose-seed.ts';
import type { RefResolver, VmiObject } from '../../api/objects.ts';
import { resolvePublicKeys } from '../kubevirt/access-credentials.ts';
import { admitAccessCredentials, admitHostname } from '../kubevirt/volume-rules.ts';
import { hasAnyData, resolveSourceData, sourceMissing } from '../kubevirt/sources.ts';
import { yieldToLoop, type SeedBudget } from '../limits.ts';
import { INLINE_OFFLOAD } from '../pure-ops.ts';
import type { RenderOptions } from '../render-options.ts';
import { appendSshKeys } from '../userdata/ssh-keys.ts';
import { ANNOTATION } from './annotation.ts';
import type { AnnotationExtras } from './extras.ts';
import { resolveExtras } from './extras-input.ts';

/**
 * Reads the annotation's text into a SeedInput: parsed (through options.offload), KubeVirt's
 * accessCredentials and hostname rules applied, data, SSH keys and extras resolved. Throws
 * VmseedError: CLOUDINIT_SOURCE_MISSING when nothing yields data, else the parse, admission and
 * reference errors of those steps (missing objects retryable).
 */
export async function readAnnotationInput(
  vmi: VmiObject,
  text: string,
  refs: RefResolver,
  budget: SeedBudget,
  options: RenderOptions,
): Promise<SeedInput> {
  const offload = options.offload ?? INLINE_OFFLOAD;
  const spec = await offload.run('parseAnnotation', [text], text.length, options.signal);
  await yieldToLoop();
  const { datasource, source, extras } = spec;
  admitAccessCredentials(vmi, { nocloud: datasource === 'nocloud', configdrive: datasource === 'configdrive' });
  admitHostname(vmi);

  const namespace = vmi.metadata.namespace ?? 'default';
  const data = await resolveSourceData(source, ANNOTATION, spec.secretRefField, 'single', namespace, refs);
  const accessKeys = await resolvePublicKeys(vmi, datasource, refs);
  const publicKeys = await appendSshKeys(accessKeys, extras.sshKeys, extras.sshKeysFrom, namespace, refs, ANNOTATION);
  // A volume needs at least one data field (KubeVirt's rule); through the
  // annotation, SSH keys alone (or any vmseed field) are a useful seed too.
  if (!hasAnyData(source) && Object.keys(publicKeys).length === 0 && !extrasProduceData(extras)) {
    throw sourceMissing(ANNOTATION, ' nor any vmseed field (init, files, metaData, sshKeys, vendorData…)');
  }
  const resolved = await resolveExtras(vmi, extras, namespace, refs, budget, options.passwordSalt);
  return { datasource, namespace, data, publicKeys, warnings: [], strict: true, extras: resolved };
}

function extrasProduceData(extras: AnnotationExtras): boolean {
  return !!(
    extras.metaData ||
    extras.userDataFrom ||
    extras.userDataScript !== undefined ||
    extras.files.length > 0 ||
    extras.forceDHCP ||
    extras.init ||
    extras.vendorData ||
    extras.vendorDataFrom
  );
}
