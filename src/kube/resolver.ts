// RefResolver backed by the Kubernetes API: Secrets and ConfigMaps read
// when asked, without a cache (the agent's reconciles read through
// object-watches.ts, which reads each object once and then watches it; this
// serves a reconcile that runs outside one). 404 means "does not exist"; transport trouble is a
// retryable KUBE_API_UNAVAILABLE. In namespaced mode (--namespaces) only
// those namespaces are asked: a VMI can only reference objects in its own
// namespace, and the agent holds no Role anywhere else.
import type { ConfigMapObject, RefResolver, SecretObject } from '../api/objects.ts';
import { statusError, type KubeApi } from './api-client.ts';
import { VmseedError } from '../errors.ts';

/**
 * Reads Secrets and ConfigMaps straight from the API server (see the module
 * comment). Throws KUBE_API_FORBIDDEN (terminal) for a namespace outside
 * `namespaces`, and statusError()'s error for any answer but 200 or 404.
 */
export class KubeRefResolver implements RefResolver {
  readonly #api: KubeApi;
  readonly #namespaces: ReadonlySet<string> | undefined;

  constructor(api: KubeApi, options: { namespaces?: readonly string[] } = {}) {
    this.#api = api;
    this.#namespaces = options.namespaces && options.namespaces.length > 0 ? new Set(options.namespaces) : undefined;
  }

  async getSecret(namespace: string, name: string): Promise<SecretObject | undefined> {
    this.#checkScope(namespace, 'Secret', name);
    return (await this.#get(
      `/api/v1/namespaces/${encodeURIComponent(namespace)}/secrets/${encodeURIComponent(name)}`,
    )) as SecretObject | undefined;
  }

  async getConfigMap(namespace: string, name: string): Promise<ConfigMapObject | undefined> {
    this.#checkScope(namespace, 'ConfigMap', name);
    return (await this.#get(
      `/api/v1/namespaces/${encodeURIComponent(namespace)}/configmaps/${encodeURIComponent(name)}`,
    )) as ConfigMapObject | undefined;
  }

  #checkScope(namespace: string, kind: string, name: string): void {
    if (this.#namespaces && !this.#namespaces.has(namespace)) {
      throw new VmseedError(
        'KUBE_API_FORBIDDEN',
        `${kind} ${namespace}/${name} is outside the agent's namespaces (--namespaces ${[...this.#namespaces].join(',')}); not read`,
        { kind: 'terminal' },
      );
    }
  }

  async #get(path: string): Promise<unknown> {
    const res = await this.#api.request('GET', path);
    if (res.status === 404) return undefined;
    if (res.status !== 200) throw statusError('GET', path, res);
    return res.body;
  }
}
