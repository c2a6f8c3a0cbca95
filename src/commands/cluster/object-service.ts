// Wiring of the node-scoped object service into the cluster component: its
// own API connection (the Deployment's service account, or --kubeconfig) and
// the HTTPS listener on --objects-listen.
import type { Logger } from 'pino';
import type { ClusterConfig } from '../../config/cluster-config.ts';
import type { Metrics } from '../../metrics/metrics.ts';
import type { ClusterService } from './service.ts';

/**
 * Starts the object service on --objects-listen; its readiness is the
 * certificate's state and the first VMI list. Throws naming the flag when it
 * cannot listen, or the connection's error when no credentials are found.
 */
export async function startObjects(config: ClusterConfig, logger: Logger, _metrics: Metrics): Promise<ClusterService> {
  const o = config.objects!;
  const [{ loadConnection }, { KubeConnectionApi }, { startObjectService }] = await Promise.all([
    import('../../kube/connection.ts'),
    import('../../kube/api-client.ts'),
    import('../../cluster/objects/object-server.ts'),
  ]);
  const connection = loadConnection(o.kubeconfig);
  let service;
  try {
    service = await startObjectService({
      listen: o.listen,
      certDir: o.certDir,
      connection,
      api: new KubeConnectionApi(connection),
      logger,
      agentServiceAccount: o.agentServiceAccount,
      ...(o.defaultVendorData ? { defaultVendorData: o.defaultVendorData } : {}),
    });
  } catch (e) {
    await connection.close();
    const why = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new Error(`cannot listen on ${o.listen.host}:${o.listen.port} (--objects-listen): ${why}`, { cause: e });
  }
  return {
    name: 'objects',
    address: service.address,
    readiness: () => service.problem(),
    close: async () => {
      await service.close();
      await connection.close();
    },
  };
}
