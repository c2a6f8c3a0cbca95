// The node agent's client of the cluster component's object service
// (--objects-url). When the service cannot be reached or says it cannot
// serve now (it restarts, its certificate is not issued yet), the VMI whose
// data it needs waits: it has not failed, and nothing about the VMI is
// wrong. So those failures get their own code, which the reconcile records
// as waiting (pending, a Normal Event), not as an error; a refusal (403) or
// a missing object stays what it is.
import { VmseedError } from '../errors.ts';
import type { KubeApi, KubeMethod, KubeResponse } from './api-client.ts';

/** `api` (pointed at the object service) with its outages as OBJECTS_SERVICE_UNAVAILABLE. */
export function objectServiceApi(api: KubeApi, url: string): KubeApi {
  const waiting = (why: string, cause?: unknown) =>
    new VmseedError(
      'OBJECTS_SERVICE_UNAVAILABLE',
      `the cluster component's object service (${url}) cannot serve now: ${why}; the VMI waits and is seeded when it answers (kubectl -n vmseed get pods -l app.kubernetes.io/component=cluster)`,
      { kind: 'retryable', ...(cause ? { cause } : {}) },
    );
  return {
    async request(
      method: KubeMethod,
      path: string,
      body?: unknown,
      contentType?: string,
      signal?: AbortSignal,
    ): Promise<KubeResponse> {
      let res: KubeResponse;
      try {
        res = await api.request(method, path, body, contentType, signal);
      } catch (e) {
        if (e instanceof VmseedError && e.code === 'KUBE_API_UNAVAILABLE')
          throw waiting(
            e.message.replace(/^Kubernetes API server unreachable \([^)]*\): /, '').replace(/; will retry$/, ''),
            e,
          );
        throw e;
      }
      if (res.status === 503) throw waiting('503 Service Unavailable');
      return res;
    },
  };
}
