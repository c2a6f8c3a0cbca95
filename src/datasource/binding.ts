// What a datasource token written at admission is bound to. A VMI's UID
// does not exist while it is admitted, so a serial the admission webhook
// writes cannot name it; it names instead:
//  - the owning VirtualMachine (the VMI's controller ownerReference, as
//    KubeVirt's virt-controller sets it): every VMI the VM starts has the
//    same namespace, name and owner UID, so the token survives restarts;
//    a VM deleted and re-created under the same name has a new UID, so the
//    old token opens nothing of it;
//  - otherwise a nonce minted at admission and kept in an annotation: the
//    VMI's own, fresh on every create, so a VMI re-created later (by anyone)
//    gets a token the old one never had.
// The HMAC input starts with a label holding a NUL, which no Kubernetes UID
// (the input of the older UID-bound tokens) contains: the two kinds of
// token never collide. docs/imds.md describes the design.

interface OwnerRef {
  apiVersion?: unknown;
  kind?: unknown;
  uid?: unknown;
  controller?: unknown;
}

/**
 * The parts of a VMI's metadata read here (structural: the webhook passes
 * the raw admitted object's, the agent its VmiObject's).
 */
export interface BindingMeta {
  ownerReferences?: readonly OwnerRef[];
  annotations?: Record<string, string>;
}

/**
 * Annotation holding the nonce a token binds to when the VMI has no owning
 * VirtualMachine; the admission webhook mints it, the agent only reads it.
 */
export const NONCE_ANNOTATION = 'vmseed.io/datasource-nonce';
const LABEL = 'vmseed datasource binding\0';
// 16 random bytes, base64url.
const NONCE_RE = /^[A-Za-z0-9_-]{22}$/;

export function isNonce(s: unknown): s is string {
  return typeof s === 'string' && NONCE_RE.test(s);
}

/**
 * The UID of the VirtualMachine that controls this VMI: the controller
 * ownerReference, if it is a kubevirt.io VirtualMachine; else undefined.
 */
export function owningVmUid(meta: Pick<BindingMeta, 'ownerReferences'>): string | undefined {
  const refs: readonly unknown[] = Array.isArray(meta.ownerReferences) ? meta.ownerReferences : [];
  const ref = refs.find(
    (r): r is OwnerRef => typeof r === 'object' && r !== null && (r as OwnerRef).controller === true,
  );
  if (ref === undefined || ref.kind !== 'VirtualMachine') return undefined;
  if (typeof ref.apiVersion !== 'string' || !ref.apiVersion.startsWith('kubevirt.io/')) return undefined;
  return typeof ref.uid === 'string' && ref.uid !== '' ? ref.uid : undefined;
}

/**
 * The message a bound token is the HMAC of, or undefined when the VMI has
 * neither an owning VM nor a nonce. `namespace` and `name` are the VMI's
 * as the caller knows them: a VMI made with generateName has no name at
 * admission, so the nonce form leaves the name out (the nonce alone is
 * unique); a VM's VMI is always named after the VM.
 */
export function bindingMessage(namespace: string, name: string | undefined, meta: BindingMeta): string | undefined {
  const vm = owningVmUid(meta);
  if (vm !== undefined && name) return `${LABEL}vm\0${namespace}\0${name}\0${vm}`;
  if (vm !== undefined) return undefined;
  const nonce = meta.annotations?.[NONCE_ANNOTATION];
  return isNonce(nonce) ? `${LABEL}nonce\0${namespace}\0${nonce}` : undefined;
}
