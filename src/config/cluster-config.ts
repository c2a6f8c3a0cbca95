// `vmseed cluster` configuration: the cluster component's own flag table, in
// the agent's style (src/config/flags.ts: one entry per flag, its
// VMSEED_<FLAG> environment fallback, its default and its check), read once
// into one frozen object. It has no modes or platforms, so each flag has a
// single default. A bad value is a ConfigError: one line, exit 2.
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { DEFAULT_DATASOURCE_BASE, datasourceSeedUrl } from '../datasource/url.ts';
import { parseVendorDataFrom, type VendorDataRef } from '../cloudinit/userdata/vendor-data.ts';
import { LOG_LEVELS, type FlagSpec, type LogLevel } from './flags.ts';
import { flagLines } from './usage.ts';
import { CLOUD_INIT_RELEASES, DEFAULT_SCHEMA_DIR } from '../cloudinit/schema/schema-store.ts';
import { ConfigError, oneOf, parseListen } from './values.ts';

type Listen = { host: string; port: number };

const path = (text: string, _flag: string, cwd: string) => resolve(cwd, text);

function namespacedName(text: string, flag: string): { namespace: string; name: string } {
  const m = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$/.exec(text);
  if (!m || m[1].length > 63 || m[3].length > 253) throw new ConfigError(`--${flag}: '${text}' is not NAMESPACE/NAME`);
  return { namespace: m[1], name: m[3] };
}

// In --help's order. Every listener is a `--<service>-listen` flag, so a
// service added to the command brings one entry here.
export const CLUSTER_FLAGS = {
  'webhook-listen': {
    arg: 'HOST:PORT|off',
    help: 'serve the mutating admission webhook (HTTPS) on this address, or off; the webhook component of the manifests pins it to the pod address ($(POD_IP):8443), the base turns it off',
    default: '0.0.0.0:8443',
    parse: (t: string, f: string): Listen | undefined => (t === 'off' ? undefined : parseListen(t, f)),
  },
  'webhook-cert-dir': {
    arg: 'DIR',
    help: "the webhook's tls.crt and tls.key (a kubernetes.io/tls Secret); reloaded when they change; missing or expired fails /readyz",
    default: '/etc/vmseed/webhook-tls',
    parse: path,
  },
  'webhook-client-ca': {
    arg: 'FILE',
    help: "require the webhook's callers to present a client certificate signed by a CA in this PEM bundle (the one that signs the API server's webhook client certificate); reloaded when it changes; missing fails /readyz. Unset: any TLS client is answered",
    optional: true,
    default: { doc: 'none' },
    parse: path,
  },
  'webhook-client-names': {
    arg: 'NAME,...',
    help: "with --webhook-client-ca: also require the client certificate's subject CN or a DNS name to be one of these",
    optional: true,
    default: { doc: 'any name the CA signed' },
    parse: (t: string, f: string): string[] => {
      const names = t.split(',').map((n) => n.trim());
      const bad = names.find((n) => !/^[A-Za-z0-9][A-Za-z0-9:._@*-]{0,252}$/.test(n));
      if (bad !== undefined) throw new ConfigError(`--${f}: '${bad}' is not a certificate name`);
      return names;
    },
  },
  'webhook-serial': {
    arg: 'off|nocloud|nocloud-net',
    help: 'write the datasource serial (spec.domain.firmware.serial) into VMIs without one, with this ds= id and a fresh random token (the webhook holds no key; the node agent serves a VMI to the token in its own serial)',
    default: 'nocloud-net',
    parse: (t, f) => oneOf(t, f, ['off', 'nocloud', 'nocloud-net'] as const),
  },
  'cloud-init-schemas': {
    arg: 'DIR',
    help: "cloud-init's JSON schemas, one directory per release (the image's); missing: the webhook checks nothing and logs why at start",
    default: DEFAULT_SCHEMA_DIR,
    parse: path,
  },
  'cloud-init-version': {
    arg: 'RELEASE|off',
    help: `the webhook warns (never refuses) about schema problems of a VMI's cloud-init data against this cloud-init release (${CLOUD_INIT_RELEASES.join(', ')}), unless the VMI's vmseed.io/cloud-init-version annotation names another or off`,
    default: '25.1',
    parse: (t, f) => oneOf(t, f, [...CLOUD_INIT_RELEASES, 'off'] as const),
  },
  'datasource-base-url': {
    arg: 'URL',
    help: "the datasource as guests reach it (the agents' --datasource-base-url)",
    default: DEFAULT_DATASOURCE_BASE,
    parse: (t, f) => {
      const baseUrl = t.replace(/\/+$/, '');
      try {
        datasourceSeedUrl(baseUrl, 'token');
        return baseUrl;
      } catch (e) {
        throw new ConfigError(`--${f}: ${(e as Error).message}`);
      }
    },
  },
  'objects-listen': {
    arg: 'HOST:PORT',
    help: "serve the node agents' --objects-url (HTTPS): each node gets and watches only the Secrets/ConfigMaps its VMIs reference; the manifests pin it to the pod address ($(POD_IP):8444)",
    optional: true,
    default: { doc: 'off' },
    parse: parseListen,
  },
  'objects-cert-dir': {
    arg: 'DIR',
    help: "the object service's tls.crt and tls.key (from cert-manager, say); reloaded when they change. Ignored with --objects-cert-secret",
    default: '/etc/vmseed/objects-tls',
    parse: path,
  },
  'objects-cert-secret': {
    arg: 'NS/NAME',
    help: 'the object service issues its own self-signed certificate into this kubernetes.io/tls Secret (shared by the replicas) and renews it 30 days before it expires (validity 365 days)',
    optional: true,
    default: { doc: 'none: the certificate comes from --objects-cert-dir' },
    parse: namespacedName,
  },
  'objects-ca-configmap': {
    arg: 'NS/NAME',
    help: "with --objects-cert-secret: publish the certificate (the agents' CA, the previous one kept until it expires) as ca.crt of this ConfigMap, which the node agents mount as --objects-ca-file",
    default: 'vmseed/vmseed-cluster-ca',
    parse: namespacedName,
  },
  'agent-service-account': {
    arg: 'NS:NAME',
    help: "the node agents' service account: only its tokens (audience vmseed-cluster, bound to a pod) are served objects",
    default: 'vmseed:vmseed',
    parse: (t: string, f: string) => {
      if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(t))
        throw new ConfigError(`--${f}: '${t}' is not NAMESPACE:NAME`);
      return t;
    },
  },
  'objects-vendor-data-from': {
    arg: 'NS/NAME[/KEY]',
    help: "the agents' --vendor-data-from: every node may read that ConfigMap",
    optional: true,
    default: { doc: 'none' },
    parse: (t: string, f: string) => {
      try {
        return parseVendorDataFrom(t);
      } catch (e) {
        throw new ConfigError(`--${f}: ${(e as Error).message}`);
      }
    },
  },
  kubeconfig: {
    arg: 'FILE',
    help: 'the Kubernetes API credentials of the object service (TokenReview, VMIs, Secrets, ConfigMaps)',
    optional: true,
    default: { doc: 'in-cluster config' },
    parse: path,
  },
  'probe-listen': {
    arg: 'HOST:PORT',
    help: '/healthz, /readyz, /metrics',
    default: '0.0.0.0:8080',
    parse: parseListen,
  },
  'log-level': {
    arg: 'LEVEL',
    help: LOG_LEVELS.join('|'),
    default: 'info',
    parse: (t, f) => oneOf(t, f, LOG_LEVELS),
  },
} satisfies Record<string, FlagSpec<unknown>>;

type ClusterFlag = keyof typeof CLUSTER_FLAGS;

/** The cluster component's validated configuration (`vmseed cluster`). */
export interface ClusterConfig {
  webhook: {
    // Absent: --webhook-listen off.
    listen: Listen | undefined;
    certDir: string;
    serial: 'off' | 'nocloud' | 'nocloud-net';
    // --webhook-client-ca (and --webhook-client-names); absent: any TLS client.
    clientAuth?: { caFile: string; names?: string[] };
  };
  // --cloud-init-schemas and --cloud-init-version: the webhook's schema warnings.
  cloudInit: { schemaDir: string; release: '22.4' | '25.1' | 'off' };
  // --kubeconfig when given (the webhook reads a VMI's Secrets with it; the object service has its own copy).
  kubeconfig?: string;
  // Where guests reach the datasource (the serial's base).
  datasource: { baseUrl: string };
  probeListen: Listen;
  logLevel: LogLevel;
  // The node-scoped object service (--objects-listen); absent: off.
  objects?: {
    listen: Listen;
    certDir: string;
    // Self-issued certificate: its Secret and the CA's ConfigMap.
    selfSigned?: { secret: { namespace: string; name: string }; caConfigMap: { namespace: string; name: string } };
    agentServiceAccount: string;
    kubeconfig?: string;
    defaultVendorData?: VendorDataRef;
  };
}

/** `vmseed cluster --help`. */
export const CLUSTER_USAGE = `usage: vmseed cluster [options]

The cluster component: runs as a Deployment off the VM nodes and serves what
no VM node should hold: the node-scoped object service (--objects-listen:
each node agent gets the Secrets and ConfigMaps its own VMIs reference, and
the unpause of its own VMIs) and the mutating admission webhook
(--webhook-listen), with /healthz, /readyz and /metrics on --probe-listen.
It holds no node's seeds.

${flagLines(CLUSTER_FLAGS)}

Every flag can also be set as VMSEED_<FLAG> in the environment (e.g. VMSEED_WEBHOOK_LISTEN).
`;

/** The VMSEED_<FLAG> environment variable of a `vmseed cluster` flag. */
export function clusterEnvName(name: string): string {
  return `VMSEED_${name.toUpperCase().replaceAll('-', '_')}`;
}

/**
 * Reads and checks `vmseed cluster`'s flags (`env` for fallbacks, `cwd` for
 * relative paths); throws ConfigError on a bad value, undefined for --help.
 */
export function loadClusterConfig(argv: string[], env: NodeJS.ProcessEnv, cwd: string): ClusterConfig | undefined {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        ...Object.fromEntries(Object.keys(CLUSTER_FLAGS).map((name) => [name, { type: 'string' as const }])),
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (e) {
    throw new ConfigError((e as Error).message.split('\n')[0]);
  }
  if (values.help) return undefined;
  const given = (name: ClusterFlag): string | undefined => {
    const v = values[name];
    if (typeof v === 'string') return v;
    const e = env[clusterEnvName(name)];
    return e === undefined || e === '' ? undefined : e;
  };
  const text = (name: string): string | undefined => {
    const g = given(name as ClusterFlag);
    if (g !== undefined) return g;
    const d = (CLUSTER_FLAGS as Record<string, FlagSpec<unknown>>)[name].default;
    if (d === undefined || typeof d === 'string') return d;
    return typeof d.text === 'function' ? d.text(context) : d.text;
  };
  const context = { local: false, text, value: (name: string) => get(name as ClusterFlag) };
  function get<K extends ClusterFlag>(name: K): ReturnType<(typeof CLUSTER_FLAGS)[K]['parse']> | undefined {
    const t = text(name);
    const spec = CLUSTER_FLAGS[name] as FlagSpec<unknown>;
    return t === undefined ? undefined : (spec.parse(t, name, cwd) as ReturnType<(typeof CLUSTER_FLAGS)[K]['parse']>);
  }
  const serial = get('webhook-serial')!;
  const baseUrl = get('datasource-base-url')!;
  const config: ClusterConfig = {
    webhook: { listen: get('webhook-listen'), certDir: get('webhook-cert-dir')!, serial },
    cloudInit: { schemaDir: get('cloud-init-schemas')!, release: get('cloud-init-version')! },
    datasource: { baseUrl },
    probeListen: get('probe-listen')!,
    logLevel: get('log-level')!,
  };
  const webhookKubeconfig = get('kubeconfig');
  if (webhookKubeconfig !== undefined) config.kubeconfig = webhookKubeconfig;
  const clientCa = get('webhook-client-ca');
  const clientNames = get('webhook-client-names');
  if (clientNames !== undefined && clientCa === undefined)
    throw new ConfigError('--webhook-client-names: needs --webhook-client-ca (the CA that signs those names)');
  if (clientCa !== undefined)
    config.webhook.clientAuth = { caFile: clientCa, ...(clientNames !== undefined ? { names: clientNames } : {}) };
  const objectsListen = get('objects-listen');
  if (objectsListen !== undefined) {
    const kubeconfig = get('kubeconfig');
    const vendorData = get('objects-vendor-data-from');
    const certSecret = get('objects-cert-secret');
    const caConfigMap = get('objects-ca-configmap')!;
    if (certSecret && caConfigMap.namespace !== certSecret.namespace)
      throw new ConfigError(
        `--objects-ca-configmap ${caConfigMap.namespace}/${caConfigMap.name}: must be in the namespace of --objects-cert-secret (${certSecret.namespace})`,
      );
    config.objects = {
      listen: objectsListen,
      certDir: get('objects-cert-dir')!,
      ...(certSecret ? { selfSigned: { secret: certSecret, caConfigMap } } : {}),
      agentServiceAccount: get('agent-service-account')!,
      ...(kubeconfig !== undefined ? { kubeconfig } : {}),
      ...(vendorData !== undefined ? { defaultVendorData: vendorData } : {}),
    };
  }
  return Object.freeze(config);
}
