// PATCH of a VMI as the API server and KubeVirt answer it, for the fake API
// server (fake-kube.ts). VMIs are a custom resource, so the API server takes
// JSON patch, merge patch and apply patch, and refuses a strategic merge
// patch with 415 (negotiation.NewUnsupportedMediaTypeError). Only the merge
// patch (RFC 7386, what the agent sends) is applied here; a JSON patch or an
// apply patch gets 415 too, which no agent call makes.
//
// The answers, each with the API server's Status and message:
// - 404 NotFound: no such VMI;
// - 400 BadRequest: a body that is not a JSON object;
// - 409 Conflict: a metadata.resourceVersion in the patch that is not the
//   stored one (optimistic concurrency);
// - 422 Invalid: a metadata.uid that is not the stored one (immutable), or
//   annotations over the 256 KiB total (apimachinery ValidateAnnotations),
//   or values that are not strings, or what KubeVirt's VMI update admitter
//   refuses (pkg/virt-api/webhooks/validating-webhook/admitters/
//   vmi-update-admitter.go): a spec change by anyone but KubeVirt's own
//   service accounts, a change to its reserved kubevirt.io/ labels.
// 403 comes first, from the fake's RBAC (verb patch).
import { isDeepStrictEqual } from 'node:util';
import type { VmiObject } from '../../src/api/objects.ts';
import { failure, type Reply } from './fake-kube-objects.ts';

export type PatchAnswer = { ok: true; object: VmiObject } | ({ ok: false } & Reply);

const MERGE_PATCH = 'application/merge-patch+json';
const ACCEPTED = ['application/json-patch+json', MERGE_PATCH, 'application/apply-patch+yaml'];
const TOTAL_ANNOTATION_BYTES = 256 * 1024;
// admitters/vmi-create-admitter.go restrictedVmiLabels.
const RESERVED_LABELS = [
  'kubevirt.io/created-by',
  'kubevirt.io/migrationJobUID',
  'kubevirt.io/nodeName',
  'kubevirt.io/migrationTargetNodeName',
  'kubevirt.io/schedulable',
  'kubevirt.io/install-strategy',
];
const WEBHOOK = 'virtualmachineinstances-update-validator.kubevirt.io';

function answerStatus(code: number, reason: string, message: string, details?: Record<string, unknown>): PatchAnswer {
  return { ok: false, ...failure(code, reason, message, details) };
}

// RFC 7386: objects merge, null deletes, anything else replaces.
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (patch === null || typeof patch !== 'object' || Array.isArray(patch)) return structuredClone(patch);
  const base = target !== null && typeof target === 'object' && !Array.isArray(target) ? target : {};
  const out: Record<string, unknown> = { ...(base as Record<string, unknown>) };
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

// `kubevirtAccount`: the caller is one of KubeVirt's service accounts (may change the spec).
export function patchVmi(
  stored: VmiObject | undefined,
  name: string,
  contentType: string,
  body: string,
  kubevirtAccount = false,
): PatchAnswer {
  const type = contentType.split(';')[0].trim();
  if (!ACCEPTED.includes(type) || type !== MERGE_PATCH)
    return answerStatus(
      415,
      'UnsupportedMediaType',
      `the body of the request was in an unknown format - accepted media types include: ${ACCEPTED.join(', ')}`,
    );
  const notFound = () =>
    answerStatus(404, 'NotFound', `virtualmachineinstances.kubevirt.io "${name}" not found`, {
      name,
      group: 'kubevirt.io',
      kind: 'virtualmachineinstances',
    });
  let patch: unknown;
  try {
    patch = JSON.parse(body);
  } catch {
    return answerStatus(400, 'BadRequest', 'Invalid JSON Patch');
  }
  if (patch === null || typeof patch !== 'object' || Array.isArray(patch))
    return answerStatus(400, 'BadRequest', 'Invalid JSON Patch');
  if (!stored) return notFound();
  const next = mergePatch(stored, patch) as VmiObject;
  const conflict = checkPreconditions(stored, next, name);
  if (conflict) return conflict;
  const invalid = invalidMetadata(next, name);
  if (invalid) return invalid;
  const refused = kubevirtAdmission(stored, next, kubevirtAccount);
  if (refused) return refused;
  return { ok: true, object: next };
}

function checkPreconditions(stored: VmiObject, next: VmiObject, name: string): PatchAnswer | undefined {
  if (next.metadata.resourceVersion !== stored.metadata.resourceVersion)
    return answerStatus(
      409,
      'Conflict',
      `Operation cannot be fulfilled on virtualmachineinstances.kubevirt.io "${name}": the object has been modified; please apply your changes to the latest version and try again`,
      { name, group: 'kubevirt.io', kind: 'virtualmachineinstances' },
    );
  if (next.metadata.uid !== stored.metadata.uid)
    return invalidField(name, 'metadata.uid', `Invalid value: "${String(next.metadata.uid)}": field is immutable`);
  return undefined;
}

function invalidMetadata(next: VmiObject, name: string): PatchAnswer | undefined {
  const annotations = (next.metadata.annotations ?? {}) as Record<string, unknown>;
  let total = 0;
  for (const [k, v] of Object.entries(annotations)) {
    if (typeof v !== 'string')
      return invalidField(name, `metadata.annotations.${k}`, 'Invalid value: the value must be a string');
    total += k.length + v.length;
  }
  if (total > TOTAL_ANNOTATION_BYTES)
    return invalidField(name, 'metadata.annotations', `Too long: must have at most ${TOTAL_ANNOTATION_BYTES} bytes`);
  return undefined;
}

function invalidField(name: string, field: string, what: string): PatchAnswer {
  return answerStatus(422, 'Invalid', `VirtualMachineInstance.kubevirt.io "${name}" is invalid: ${field}: ${what}`, {
    name,
    group: 'kubevirt.io',
    kind: 'VirtualMachineInstance',
    causes: [{ reason: 'FieldValueInvalid', message: what, field }],
  });
}

// The API server's message for a validating webhook's denial, with
// KubeVirt's own text (webhooks.ToAdmissionResponse: 422, Invalid).
function kubevirtAdmission(stored: VmiObject, next: VmiObject, kubevirtAccount: boolean): PatchAnswer | undefined {
  const denied = (why: string) =>
    answerStatus(422, 'Invalid', `admission webhook "${WEBHOOK}" denied the request: ${why}`, {
      causes: [{ reason: 'FieldValueNotSupported', message: why }],
    });
  if (kubevirtAccount) return undefined;
  if (!isDeepStrictEqual(stored.spec, next.spec)) return denied('update of VMI object is restricted');
  const reserved = (v: VmiObject) => RESERVED_LABELS.map((l) => v.metadata.labels?.[l]);
  if (!isDeepStrictEqual(reserved(stored), reserved(next)))
    return denied('modification of the following reserved kubevirt.io/ labels on a VMI object is prohibited');
  return undefined;
}
