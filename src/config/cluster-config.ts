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
import { ConfigError, oneOf, parseListen } from './values.ts';

type Listen = { host: string; port: number };

const path = (text: string, _flag: string, cwd: string) => resolve(cwd, text);

// In --help's order. Every listener is a `--<service>-listen` flag, so a
// service added to the command brings one entry here.
export const CLUSTER_FLAGS = {
  'webhook-listen': {
    arg: 'HOST:PORT',
    help: 'serve the mutating admission webhook (HTTPS) on this address; the manifests pin it to the pod address ($(POD_IP):8443)',
    default: '0.0.0.0:8443',
    parse: parseListen,
  },
  'webhook-cert-dir': {
    arg: 'DIR',
    help: "the webhook's tls.crt and tls.key (a kubernetes.io/tls Secret); reloaded when they change; missing or expired fails /readyz",
    default: '/etc/vmseed/webhook-tls',
    parse: path,
  },
  'webhook-serial': {
    arg: 'off|nocloud|nocloud-net',
    help: 'write the datasource serial (spec.domain.firmware.serial) into VMIs without one, with this ds= id (needs --datasource-key-file)',
    default: {
      text: (c) => (c.text('datasource-key-file') === undefined ? 'off' : 'nocloud-net'),
      doc: 'nocloud-net with --datasource-key-file, else off',
    },
    parse: (t, f) => oneOf(t, f, ['off', 'nocloud', 'nocloud-net'] as const),
  },
  'datasource-key-file': {
    arg: 'FILE',
    help: "the datasource's token keys (the vmseed-datasource-key Secret): the serial's token is signed with its first key; reloaded when it changes",
    optional: true,
    default: { doc: 'none: no serial is written' },
    parse: path,
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
    help: "serve the node agents' --objects-url (HTTPS): each node gets and watches only the Secrets/ConfigMaps its VMIs reference; the manifests give 0.0.0.0:8444",
    optional: true,
    default: { doc: 'off' },
    parse: parseListen,
  },
  'objects-cert-dir': {
    arg: 'DIR',
    help: "the object service's tls.crt and tls.key; reloaded when they change",
    default: '/etc/vmseed/objects-tls',
    parse: path,
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
    listen: Listen;
    certDir: string;
    serial: 'off' | 'nocloud' | 'nocloud-net';
  };
  // The serial's token keys and where guests reach the datasource; absent
  // when no serial is written.
  datasource?: { keyFile: string; baseUrl: string };
  probeListen: Listen;
  logLevel: LogLevel;
  // The node-scoped object service (--objects-listen); absent: off.
  objects?: {
    listen: Listen;
    certDir: string;
    agentServiceAccount: string;
    kubeconfig?: string;
    defaultVendorData?: VendorDataRef;
  };
}

/** `vmseed cluster --help`. */
export const CLUSTER_USAGE = `usage: vmseed cluster [options]

The cluster component: runs as a Deployment off the VM nodes and serves the
mutating admission webhook, with /healthz, /readyz and /metrics on
--probe-listen. It holds no node's seeds and reads no VMI's data.

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
  const keyFile = get('datasource-key-file');
  const baseUrl = get('datasource-base-url')!;
  if (serial !== 'off' && keyFile === undefined)
    throw new ConfigError(
      `--webhook-serial ${serial} needs --datasource-key-file FILE (the serial's token is signed with the datasource key); or --webhook-serial off`,
    );
  const config: ClusterConfig = {
    webhook: { listen: get('webhook-listen')!, certDir: get('webhook-cert-dir')!, serial },
    ...(serial !== 'off' && keyFile !== undefined ? { datasource: { keyFile, baseUrl } } : {}),
    probeListen: get('probe-listen')!,
    logLevel: get('log-level')!,
  };
  const objectsListen = get('objects-listen');
  if (objectsListen !== undefined) {
    const kubeconfig = get('kubeconfig');
    const vendorData = get('objects-vendor-data-from');
    config.objects = {
      listen: objectsListen,
      certDir: get('objects-cert-dir')!,
      agentServiceAccount: get('agent-service-account')!,
      ...(kubeconfig !== undefined ? { kubeconfig } : {}),
      ...(vendorData !== undefined ? { defaultVendorData: vendorData } : {}),
    };
  }
  return Object.freeze(config);
}
