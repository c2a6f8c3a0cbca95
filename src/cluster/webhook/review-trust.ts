// Whether an AdmissionReview may make the webhook read the Secrets and
// ConfigMaps its VMI names. Without client certificates (--webhook-client-ca)
// any pod that reaches the port can post a review, and an answer that
// depends on an object (adopted or not, a schema problem's path) would tell
// it whether another tenant's Secret exists and what shape its content has.
// So objects are read only for a review known to be the API server's:
//  - the caller presented a client certificate the client CA signed; or
//  - the VMI is made by a VirtualMachine that exists under the UID its
//    ownerReference names, whose template holds the same cloud-init volumes
//    and the same vmseed annotation. A VM's UID cannot be read from outside
//    its namespace, so a forged review cannot name one, and what the
//    template references is what the VM's owner wrote.
// Anything else gets the answer it would get if it named no object.
import { isDeepStrictEqual } from 'node:util';
import { VmseedError } from '../../errors.ts';
import type { RefResolver } from '../../api/objects.ts';
import { ANNOTATION } from '../../cloudinit/annotation/annotation.ts';
import type { KubeApi } from '../../kube/api-client.ts';

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const cloudInit = (v: unknown): boolean =>
  isObject(v) && (v.cloudInitNoCloud !== undefined || v.cloudInitConfigDrive !== undefined);

function str(v: unknown): string {
  return typeof v === 'string' ? v : '';
}

/**
 * Why the review's VMI may not make the webhook read objects, or undefined when its
 * VirtualMachine vouches for it (header). `api` reads the VM with the component's credentials.
 */
export async function vmVouches(vmi: unknown, namespace: string, api: KubeApi): Promise<string | undefined> {
  const unverified =
    "the review is not known to be the API server's: the VMI is not made by a VirtualMachine that vouches for it, and the webhook authenticates no caller (--webhook-client-ca)";
  const meta = isObject(vmi) && isObject(vmi.metadata) ? vmi.metadata : {};
  const spec = isObject(vmi) && isObject(vmi.spec) ? vmi.spec : {};
  const owners = Array.isArray(meta.ownerReferences) ? meta.ownerReferences : [];
  const owner = owners.find(
    (o): o is Json =>
      isObject(o) &&
      o.kind === 'VirtualMachine' &&
      o.controller === true &&
      str(o.apiVersion).startsWith('kubevirt.io/'),
  );
  const name = str(owner?.name);
  const uid = str(owner?.uid);
  if (!owner || name === '' || uid === '') return unverified;
  const res = await api.request(
    'GET',
    `/apis/kubevirt.io/v1/namespaces/${encodeURIComponent(namespace)}/virtualmachines/${encodeURIComponent(name)}`,
  );
  if (res.status !== 200 || !isObject(res.body)) return unverified;
  const vm = res.body;
  const vmMeta = isObject(vm.metadata) ? vm.metadata : {};
  if (vmMeta.uid !== uid) return unverified;
  const template = isObject(vm.spec) && isObject(vm.spec.template) ? vm.spec.template : {};
  const templateSpec = isObject(template.spec) ? template.spec : {};
  const templateMeta = isObject(template.metadata) ? template.metadata : {};
  const volumes = (v: unknown): unknown[] => (Array.isArray(v) ? v.filter(cloudInit) : []);
  if (!isDeepStrictEqual(volumes(spec.volumes), volumes(templateSpec.volumes))) return unverified;
  const annotation = (m: Json): unknown => (isObject(m.annotations) ? m.annotations[ANNOTATION] : undefined);
  if (annotation(meta) !== annotation(templateMeta)) return unverified;
  return undefined;
}

/**
 * `inner`, read only once `allowed()` resolves undefined; otherwise each read throws a terminal
 * VmseedError REVIEW_UNVERIFIED with the reason. `allowed` is called once, at the first read.
 */
export function gatedResolver(inner: RefResolver, allowed: () => Promise<string | undefined>): RefResolver {
  let decided: Promise<string | undefined> | undefined;
  const check = async (): Promise<void> => {
    decided ??= allowed().catch((e: unknown) => `its VirtualMachine could not be read (${(e as Error).message})`);
    const why = await decided;
    if (why !== undefined) throw new VmseedError('REVIEW_UNVERIFIED', why, { kind: 'terminal' });
  };
  return {
    getSecret: async (namespace, name) => {
      await check();
      return inner.getSecret(namespace, name);
    },
    getConfigMap: async (namespace, name) => {
      await check();
      return inner.getConfigMap(namespace, name);
    },
  };
}
