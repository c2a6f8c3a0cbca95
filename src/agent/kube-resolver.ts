// RefResolver backed by the Kubernetes API: Secrets and ConfigMaps are read
// when a reconcile needs them (no Secret watch: the agent's RBAC stays
// `get` on Secrets). 404 means "does not exist"; transport trouble is a
// retryable KUBE_API_UNAVAILABLE.
import type { ConfigMapObject, RefResolver, SecretObject } from '../cloudinit/kube-types.ts';
import { statusError, type KubeApi } from './kube-api.ts';

export class KubeRefResolver implements RefResolver {
  readonly #api: KubeApi;

  constructor(api: KubeApi) {
    this.#api = api;
  }

  getSecret(namespace: string, name: string): Promise<SecretObject | undefined> {
    return this.#get(`/api/v1/namespaces/${encodeURIComponent(namespace)}/secrets/${encodeURIComponent(name)}`) as Promise<SecretObject | undefined>;
  }

  getConfigMap(namespace: string, name: string): Promise<ConfigMapObject | undefined> {
    return this.#get(`/api/v1/namespaces/${encodeURIComponent(namespace)}/configmaps/${encodeURIComponent(name)}`) as Promise<ConfigMapObject | undefined>;
  }

  async #get(path: string): Promise<unknown> {
    const res = await this.#api.request('GET', path);
    if (res.status === 404) return undefined;
    if (res.status !== 200) throw statusError('GET', path, res.status);
    return res.body;
  }
}
