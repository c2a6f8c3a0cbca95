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
  const [{ loadConnection }, { KubeConnectionApi }, { startObjectService }, serving] = await Promise.all([
    import('../../kube/connection.ts'),
    import('../../kube/api-client.ts'),
    import('../../cluster/objects/object-server.ts'),
    import('../../cluster/objects/serving-cert.ts'),
  ]);
  const connection = await loadConnection(o.kubeconfig);
  const api = new KubeConnectionApi(connection);
  let service;
  try {
    service = await startObjectService({
      listen: o.listen,
      ...(o.selfSigned ? {} : { certDir: o.certDir }),
      connection,
      api,
      logger,
      agentServiceAccount: o.agentServiceAccount,
      ...(o.defaultVendorData ? { defaultVendorData: o.defaultVendorData } : {}),
    });
  } catch (e) {
    await connection.close();
    const why = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new Error(`cannot listen on ${o.listen.host}:${o.listen.port} (--objects-listen): ${why}`, { cause: e });
  }
  // The self-issued certificate: at once when the API server answers, then
  // renewed (or taken from the replica that renewed it first) by the keeper.
  // Until the first one is in, /readyz says so and no agent is sent here.
  const live = service;
  const keeper = o.selfSigned
    ? serving.servingCertKeeper({
        api,
        logger: logger.child({ component: 'objects-cert' }),
        namespace: o.selfSigned.secret.namespace,
        secretName: o.selfSigned.secret.name,
        configMapName: o.selfSigned.caConfigMap.name,
        dnsNames: serviceNames(o.selfSigned.secret.namespace),
        onCert: (cert, key) => live.setCertificate(cert, key),
      })
    : undefined;
  keeper?.start();
  return {
    name: 'objects',
    address: service.address,
    readiness: () => service.problem() ?? (keeper?.problem() ? `certificate: ${keeper.problem()}` : undefined),
    close: async () => {
      keeper?.stop();
      await service.close();
      await connection.close();
    },
  };
}

// The names agents dial: the vmseed-cluster Service of the component's
// namespace (manifests/cluster.yaml), short and fully qualified.
function serviceNames(namespace: string): string[] {
  return [`vmseed-cluster.${namespace}.svc`, `vmseed-cluster.${namespace}.svc.cluster.local`];
}
