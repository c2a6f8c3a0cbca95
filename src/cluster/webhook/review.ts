// AdmissionReview (admission.k8s.io/v1) in and out. The body is parsed only
// after the server has checked its size; here its shape is checked before
// anything of it is used. What is not a v1 AdmissionReview with a request
// uid is refused (HTTP 400, a plain sentence); a review of anything else
// than a VMI being created is allowed unchanged.
import { Buffer } from 'node:buffer';
import type { PatchOperation } from './mutate.ts';

export const REVIEW_API_VERSION = 'admission.k8s.io/v1';
// A request uid is a Kubernetes UID (36 characters); anything far longer is
// not one, and it is echoed back.
const MAX_UID_LENGTH = 128;

export interface VmiCreate {
  uid: string;
  namespace: string;
  object: unknown;
  // A dry run: the answer must have no side effect (no Event).
  dryRun: boolean;
}

export type ReadReview =
  | { kind: 'invalid'; message: string }
  // Answered allowed, without a patch.
  | { kind: 'pass'; uid: string; why: string }
  | { kind: 'vmi-create'; review: VmiCreate };

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function readReview(body: Buffer): ReadReview {
  let doc: unknown;
  try {
    doc = JSON.parse(body.toString('utf8'));
  } catch {
    return { kind: 'invalid', message: 'the body is not JSON' };
  }
  if (!isObject(doc)) return { kind: 'invalid', message: 'the body is not a JSON object' };
  if (doc.kind !== 'AdmissionReview' || doc.apiVersion !== REVIEW_API_VERSION)
    return { kind: 'invalid', message: `expected an AdmissionReview of ${REVIEW_API_VERSION}` };
  const request = doc.request;
  if (!isObject(request)) return { kind: 'invalid', message: 'the AdmissionReview has no request' };
  const uid = request.uid;
  if (typeof uid !== 'string' || uid === '' || uid.length > MAX_UID_LENGTH || !/^[\x21-\x7e]+$/.test(uid))
    return { kind: 'invalid', message: 'the AdmissionReview request has no valid uid' };
  const resource = isObject(request.resource) ? request.resource : {};
  if (resource.group !== 'kubevirt.io' || resource.resource !== 'virtualmachineinstances')
    return { kind: 'pass', uid, why: 'not a VirtualMachineInstance' };
  if (request.subResource !== undefined && request.subResource !== '')
    return { kind: 'pass', uid, why: 'a subresource' };
  if (request.operation !== 'CREATE') return { kind: 'pass', uid, why: 'not a create' };
  const object = request.object;
  if (!isObject(object)) return { kind: 'pass', uid, why: 'no object' };
  if (object.kind !== undefined && object.kind !== 'VirtualMachineInstance')
    return { kind: 'pass', uid, why: 'the object is not a VirtualMachineInstance' };
  const namespace = typeof request.namespace === 'string' ? request.namespace : '';
  const objectNamespace = isObject(object.metadata) ? object.metadata.namespace : undefined;
  const ns = namespace || (typeof objectNamespace === 'string' ? objectNamespace : '');
  if (ns === '') return { kind: 'pass', uid, why: 'no namespace' };
  return { kind: 'vmi-create', review: { uid, namespace: ns, object, dryRun: request.dryRun === true } };
}

// The AdmissionReview answer: allowed, with the patch and the warnings when there are.
export function reviewResponse(
  uid: string,
  patch: readonly PatchOperation[] = [],
  warnings: readonly string[] = [],
): string {
  return JSON.stringify({
    apiVersion: REVIEW_API_VERSION,
    kind: 'AdmissionReview',
    response: {
      uid,
      allowed: true,
      ...(patch.length > 0
        ? { patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(patch)).toString('base64') }
        : {}),
      ...(warnings.length > 0 ? { warnings } : {}),
    },
  });
}
