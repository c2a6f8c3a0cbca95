// `vmseed agent` configuration: flags with environment fallbacks, validated
// once into one frozen object. A bad value is a ConfigError whose message is
// the single line printed before exiting 2.
import { parseArgs } from 'node:util';
import { hostname } from 'node:os';
import { resolve } from 'node:path';
import { parseVendorDataFrom, type VendorDataRef } from './cloudinit/userdata/vendor-data.ts';
import { DEFAULT_MAX_NETWORK_DATA_BYTES, DEFAULT_MAX_USER_DATA_BYTES } from './cloudinit/limits.ts';
import { DEFAULT_DATASOURCE_BASE, datasourceSeedUrl } from './commands/seed-url.ts';
import { normalisePrefix } from './http/datasource-path.ts';
import { encodeUriValue } from './libvirt/template.ts';
import { localUriSocket } from './libvirt/rpc/uri.ts';

export type KubevirtVolumes = 'own' | 'ignore';
// virsh: one `virsh` process per call (works wherever virsh does); rpc:
// libvirt's RPC protocol over one long-lived socket per URI, with domain
// events (local unix sockets only).
export type LibvirtMode = 'off' | 'virsh' | 'rpc';
export type Platform = 'kubevirt' | 'libvirt';
export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';

export interface Config {
  mode: 'kubernetes' | 'local';
  // local mode: the directory of YAML manifests.
  localDir?: string;
  nodeName: string;
  stateDir: string;
  listen: { host: string; port: number };
  // The per-VMI detail (status page, /status.json, /status/<ns>/<name>).
  // Equal to `listen`: one listener serves everything.
  statusListen: { host: string; port: number };
  kubeconfig?: string;
  concurrency: number;
  kubevirtVolumes: KubevirtVolumes;
  resyncPeriodMs: number;
  // After SIGTERM: how long in-flight work may run before the agent exits anyway.
  shutdownTimeoutMs: number;
  logLevel: LogLevel;
  libvirt: {
    mode: LibvirtMode;
    // The preset the defaults below come from: kubevirt (each VM's libvirt
    // in its virt-launcher pod, attached live only, resumed by KubeVirt) or
    // libvirt (libvirt on the host).
    platform: Platform;
    // Where the kubelet's /var/lib/kubelet/pods is mounted (kubevirt).
    podsDir: string;
    virshPath: string;
    // Templates: {namespace}, {name}, {uid}, {datasource}, {podUID} (the
    // VMI's launcher pod on this node) per VMI; the image path also {path}
    // (the published copy as the agent sees it) and {basename}.
    uri: string;
    domainName: string;
    imagePathInDomain: string;
    // Copy images into this per-VMI directory for the domain (KubeVirt: a
    // `vmseed` directory in the launcher pod's ephemeral-disks emptyDir; its
    // last component is created when missing); absent: used in place.
    publishDir?: string;
    // How the seed gate resumes a paused domain.
    resumeVia: 'virsh' | 'kubevirt';
    diskBus: 'virtio' | 'scsi';
    virshTimeoutMs: number;
  };
  maxUserDataBytes: number;
  maxNetworkDataBytes: number;
  // fsync each image and its directory before the rename is final (crash safety).
  fsync: boolean;
  // NoCloud over HTTP (absent: off).
  datasource?: DatasourceConfig;
  // Operator-wide vendor-data ConfigMap (RenderOptions.defaultVendorData).
  vendorDataFrom?: VendorDataRef;
  // Namespaced mode: watch and read only these (absent: cluster-wide).
  namespaces?: string[];
  // The redirect sidecar's /readyz, polled for the status page only.
  redirectStatusUrl?: string;
}

export interface DatasourceConfig {
  listen: { host: string; port: number };
  keyFile: string;
  // What guests use (the DMI serial's `s=`), not where we listen.
  baseUrl: string;
  // The base URL's path: what the listener serves under (default /v1).
  prefix: string;
  compatSourceAddress: boolean;
  // Token-less requests answered by source address for VMIs with KubeVirt
  // IMDS's annotations only (src/http/datasource-imds.ts).
  imdsCompat?: boolean;
}

export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

const OPTIONS = {
  'node-name': { type: 'string' },
  platform: { type: 'string' },
  'pods-dir': { type: 'string' },
  'status-listen': { type: 'string' },
  'state-dir': { type: 'string' },
  listen: { type: 'string' },
  kubeconfig: { type: 'string' },
  concurrency: { type: 'string' },
  'kubevirt-volumes': { type: 'string' },
  'resync-period': { type: 'string' },
  'shutdown-timeout': { type: 'string' },
  libvirt: { type: 'string' },
  'log-level': { type: 'string' },
  local: { type: 'string' },
  'virsh-path': { type: 'string' },
  'libvirt-uri': { type: 'string' },
  'domain-name': { type: 'string' },
  'image-path-in-domain': { type: 'string' },
  'publish-dir': { type: 'string' },
  'resume-via': { type: 'string' },
  'disk-bus': { type: 'string' },
  'virsh-timeout': { type: 'string' },
  'max-user-data-bytes': { type: 'string' },
  'max-network-data-bytes': { type: 'string' },
  fsync: { type: 'string' },
  'datasource-listen': { type: 'string' },
  'datasource-key-file': { type: 'string' },
  'datasource-base-url': { type: 'string' },
  'datasource-compat-source-address': { type: 'boolean' },
  'datasource-imds-compat': { type: 'boolean' },
  'vendor-data-from': { type: 'string' },
  'redirect-status-url': { type: 'string' },
  namespaces: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

// Environment fallbacks, one per flag: VMSEED_<FLAG> (NODE_NAME and
// KUBECONFIG keep their conventional names).
function envName(flag: string): string {
  if (flag === 'node-name') return 'NODE_NAME';
  if (flag === 'kubeconfig') return 'KUBECONFIG';
  return `VMSEED_${flag.toUpperCase().replaceAll('-', '_')}`;
}

export const AGENT_USAGE = `usage: vmseed agent [options]

  --local DIR                 run on a directory of YAML manifests instead of a cluster
  --node-name NAME            this node (env NODE_NAME; required in cluster mode)
  --platform kubevirt|libvirt  preset of the libvirt-side defaults (cluster: kubevirt, local: libvirt)
  --pods-dir DIR              the kubelet's /var/lib/kubelet/pods as mounted here (default /pods)
  --state-dir DIR             where seed images go (cluster: /var/lib/vmseed/seeds, local: ./var/seeds)
  --listen HOST:PORT          /healthz, /readyz, /metrics (cluster: 0.0.0.0:8080, local: 127.0.0.1:8080)
  --status-listen HOST:PORT   status page, /status.json, /status/NS/NAME: every VMI's names and errors
                              (cluster: 127.0.0.1:8090, local: the --listen address, one listener)
  --kubeconfig FILE           (env KUBECONFIG; in-cluster config when absent)
  --concurrency N             reconciles in parallel (default 4)
  --kubevirt-volumes own|ignore  read VMIs' cloudInitNoCloud/ConfigDrive volumes (cluster: ignore, local: own)
  --resync-period DURATION    re-check every VMI this often (default 10m; e.g. 30s, 5m, 1h)
  --shutdown-timeout DURATION after SIGTERM, how long in-flight work may run before the agent exits
                              anyway (default 20s; keep ~5s under terminationGracePeriodSeconds)
  --libvirt off|virsh|rpc     inject seeds into libvirt domains: virsh (a virsh process per call) or rpc
                              (libvirt's protocol on one socket per URI, domain events; local sockets
                              only) (local default off; cluster default rpc, virsh when --libvirt-uri
                              is not a local qemu URI)
  --platform kubevirt|libvirt the defaults of the libvirt side (cluster: kubevirt, local: libvirt); the
                              flags below override single values
  --pods-dir DIR              the kubelet's /var/lib/kubelet/pods as mounted here (default /pods)
  --virsh-path PATH           (default virsh)
  --libvirt-uri TEMPLATE      kubevirt: the launcher's socket, qemu+unix:///session?socket=
                              {pods-dir}/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock;
                              libvirt: qemu:///system
  --domain-name TEMPLATE      libvirt domain of a VMI (default {namespace}_{name}, as KubeVirt names them)
  --image-path-in-domain TEMPLATE  image path as the domain sees it (kubevirt:
                              /var/run/kubevirt-ephemeral-disks/vmseed/{basename}; libvirt: {path}, this host's)
  --publish-dir TEMPLATE      copy each image into this directory for its domain, created when its parent
                              exists (kubevirt: {pods-dir}/{podUID}/volumes/kubernetes.io~empty-dir/
                              ephemeral-disks/vmseed; libvirt: none, the image is used where it is)
  --resume-via virsh|kubevirt how the seed gate resumes a paused VM (kubevirt: kubevirt, the only one
                              allowed; libvirt: virsh)
  --disk-bus virtio|scsi      bus of the seed disk: scsi sdzz, virtio vdzz (kubevirt: scsi, virtio when the
                              domain has no virtio-scsi controller; libvirt: virtio)
  --virsh-timeout DURATION    per libvirt call, virsh or rpc (default 30s)
  --log-level LEVEL           fatal|error|warn|info|debug|trace|silent (default info)
  --fsync true|false          fsync images before they replace the old ones (default true)
  --max-user-data-bytes N     largest user-data (and vendor-data) of a seed, after merging (default 1048576, 1 MiB)
  --max-network-data-bytes N  largest network data of a seed (default 1048576, 1 MiB)
  --vendor-data-from NS/NAME[/KEY]  ConfigMap key (default vendor-data) used as every seed's vendor-data
                              unless the VMI sets its own
  --namespaces NS[,NS...]     namespaced mode: watch VMIs and read Secrets/ConfigMaps only in these
                              namespaces, with a Role per namespace (default: cluster-wide)
  --datasource-listen HOST:PORT  serve seeds as NoCloud over HTTP on this address (off when absent)
  --datasource-key-file FILE  token keys, one base64 key per line, signing key first (required with
                              --datasource-listen; reloaded when it changes)
  --datasource-base-url URL   the datasource as guests reach it (default ${DEFAULT_DATASOURCE_BASE})
  --datasource-imds-compat    answer token-less /v1/... by source address, for VMIs with KubeVirt IMDS's
                              imds.kubevirt.io/enabled annotation only
  --redirect-status-url URL   the redirect sidecar's /readyz (e.g. http://$(HOST_IP):8082/readyz):
                              polled for the status page, not part of the agent's own /readyz
  --datasource-compat-source-address  also answer token-less /v1/... by the caller's source address
                              (weak identity: read the operations guide before enabling)

Every flag can also be set as VMSEED_<FLAG> in the environment (e.g. VMSEED_STATE_DIR).
`;

// Plain http only, no credentials: it is shown on the status page.
export function parseRedirectStatusUrl(text: string): string {
  let u: URL;
  try {
    u = new URL(text);
  } catch {
    throw new ConfigError(
      `--redirect-status-url: '${text}' is not a URL; give the redirect sidecar's readiness endpoint, e.g. http://127.0.0.1:8082/readyz`,
    );
  }
  if (u.protocol !== 'http:' || u.username || u.password || text.length > 512) {
    throw new ConfigError(
      "--redirect-status-url must be a plain http:// URL without credentials, at most 512 characters (the sidecar's /readyz, e.g. http://127.0.0.1:8082/readyz)",
    );
  }
  return u.href;
}

export function parseDuration(text: string, flag: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text.trim());
  if (!m) throw new ConfigError(`--${flag}: '${text}' is not a duration; use e.g. 500ms, 30s, 5m or 1h`);
  const n = Number(m[1]);
  const unit = m[2] ?? 's';
  const ms = n * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[unit]!;
  if (ms <= 0) throw new ConfigError(`--${flag}: must be greater than zero`);
  return Math.round(ms);
}

function parseIntFlag(text: string, flag: string, min: number, max: number): number {
  if (!/^\d+$/.test(text.trim())) throw new ConfigError(`--${flag}: '${text}' is not a whole number`);
  const n = Number(text);
  if (n < min || n > max) throw new ConfigError(`--${flag}: ${n} is out of range; use ${min}..${max}`);
  return n;
}

// The URIs the RPC client dials itself (src/libvirt/rpc/uri.ts); others
// (ssh, tls, tcp) need virsh.
function rpcDialable(uriTemplate: string): boolean {
  return localUriSocket(uriTemplate) !== undefined;
}

function oneOf<T extends string>(text: string, flag: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(text)) {
    throw new ConfigError(`--${flag}: '${text}' is not one of ${allowed.join(', ')}`);
  }
  return text as T;
}

export function parseListen(text: string, flag = 'listen'): { host: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s]*)):(\d+)$/.exec(text.trim());
  if (!m) throw new ConfigError(`--${flag}: '${text}' is not HOST:PORT (e.g. 127.0.0.1:8080 or :8080)`);
  const port = Number(m[3]);
  if (port > 65535) throw new ConfigError(`--${flag}: port ${port} is out of range; use 0..65535`);
  return { host: m[1] ?? (m[2] || '0.0.0.0'), port };
}

// {podUID}: the VMI's virt-launcher pod on this node (status.activePods).
const VMI_PLACEHOLDERS = ['namespace', 'name', 'uid', 'datasource', 'podUID'];

function checkTemplate(text: string, flag: string, allowed = VMI_PLACEHOLDERS): string {
  for (const [, name] of text.matchAll(/\{([^}]*)\}/g)) {
    if (!allowed.includes(name)) {
      throw new ConfigError(`--${flag}: unknown placeholder {${name}}; use ${allowed.map((a) => `{${a}}`).join(', ')}`);
    }
  }
  if (text.trim() === '') throw new ConfigError(`--${flag}: must not be empty`);
  return text;
}

// Paths inside a launcher pod as the kubelet lays it out on the node
// (emptyDirs under volumes/kubernetes.io~empty-dir/<volume name>; KubeVirt
// names them libvirt-runtime and ephemeral-disks).
const EMPTY_DIR = 'volumes/kubernetes.io~empty-dir';
const LAUNCHER_SOCKET = (podsDir: string, pod: string) =>
  `${podsDir}/${pod}/${EMPTY_DIR}/libvirt-runtime/virtqemud-sock`;
// sun_path holds 108 bytes with the terminating NUL.
const MAX_SOCKET_PATH = 107;

interface PlatformDefaults {
  uri: string;
  imagePathInDomain: string;
  publishDir?: string;
  resumeVia: 'virsh' | 'kubevirt';
  diskBus: 'virtio' | 'scsi';
}

function platformDefaults(platform: Platform, podsDir: string): PlatformDefaults {
  if (platform === 'libvirt')
    return { uri: 'qemu:///system', imagePathInDomain: '{path}', resumeVia: 'virsh', diskBus: 'virtio' };
  return {
    // How KubeVirt itself reaches a non-root launcher's virtqemud; the
    // directory is percent-encoded as the rest of the URI's values are.
    uri: `qemu+unix:///session?socket=${LAUNCHER_SOCKET(encodeUriValue(podsDir), '{podUID}')}`,
    // The launcher's ephemeral-disks emptyDir (mounted there at
    // /var/run/kubevirt-ephemeral-disks): outside hotplug-disks, whose foreign
    // disks KubeVirt's launcher detaches on every sync.
    publishDir: `${podsDir}/{podUID}/${EMPTY_DIR}/ephemeral-disks/vmseed`,
    imagePathInDomain: '/var/run/kubevirt-ephemeral-disks/vmseed/{basename}',
    resumeVia: 'kubevirt',
    diskBus: 'scsi',
  };
}

// Returns undefined when --help was asked for.
export function loadConfig(argv: string[], env: NodeJS.ProcessEnv, cwd: string): Config | undefined {
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options: OPTIONS, strict: true, allowPositionals: false });
  } catch (e) {
    throw new ConfigError((e as Error).message.split('\n')[0]);
  }
  if (parsed.values.help) return undefined;
  const values = parsed.values as Record<string, string | boolean | undefined>;
  const get = (flag: keyof typeof OPTIONS): string | undefined => {
    const v = values[flag];
    if (typeof v === 'string') return v;
    const e = env[envName(flag)];
    return e === undefined || e === '' ? undefined : e;
  };

  const localDir = get('local');
  const local = localDir !== undefined;
  const nodeName = get('node-name') ?? (local ? hostname() : undefined);
  if (!nodeName)
    throw new ConfigError(
      '--node-name (or NODE_NAME) is required in cluster mode; set it from spec.nodeName in the DaemonSet',
    );
  if (!/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(nodeName)) {
    throw new ConfigError(`--node-name: '${nodeName}' is not a valid Kubernetes node name`);
  }
  const stateDir = resolve(cwd, get('state-dir') ?? (local ? 'var/seeds' : '/var/lib/vmseed/seeds'));
  const listen = parseListen(get('listen') ?? (local ? '127.0.0.1:8080' : '0.0.0.0:8080'));
  const platform = oneOf(get('platform') ?? (local ? 'libvirt' : 'kubevirt'), 'platform', [
    'kubevirt',
    'libvirt',
  ] as const);
  const podsDir = resolve(cwd, get('pods-dir') ?? '/pods');
  const preset = platformDefaults(platform, podsDir);
  const config: Config = {
    mode: local ? 'local' : 'kubernetes',
    statusListen:
      get('status-listen') !== undefined
        ? parseListen(get('status-listen')!, 'status-listen')
        : local
          ? listen
          : { host: '127.0.0.1', port: 8090 },
    ...(local ? { localDir: resolve(cwd, localDir) } : {}),
    nodeName,
    stateDir,
    listen,
    ...(get('kubeconfig') !== undefined ? { kubeconfig: resolve(cwd, get('kubeconfig')!) } : {}),
    concurrency: parseIntFlag(get('concurrency') ?? '4', 'concurrency', 1, 256),
    kubevirtVolumes: oneOf(get('kubevirt-volumes') ?? (local ? 'own' : 'ignore'), 'kubevirt-volumes', [
      'own',
      'ignore',
    ] as const),
    resyncPeriodMs: parseDuration(get('resync-period') ?? '10m', 'resync-period'),
    shutdownTimeoutMs: parseDuration(get('shutdown-timeout') ?? '20s', 'shutdown-timeout'),
    logLevel: oneOf(get('log-level') ?? 'info', 'log-level', [
      'fatal',
      'error',
      'warn',
      'info',
      'debug',
      'trace',
      'silent',
    ] as const),
    libvirt: {
      mode: oneOf(
        get('libvirt') ?? (local ? 'off' : rpcDialable(get('libvirt-uri') ?? preset.uri) ? 'rpc' : 'virsh'),
        'libvirt',
        ['off', 'virsh', 'rpc'] as const,
      ),
      platform,
      podsDir,
      virshPath: get('virsh-path') ?? 'virsh',
      uri: checkTemplate(get('libvirt-uri') ?? preset.uri, 'libvirt-uri'),
      domainName: checkTemplate(get('domain-name') ?? '{namespace}_{name}', 'domain-name'),
      imagePathInDomain: checkTemplate(
        get('image-path-in-domain') ?? preset.imagePathInDomain,
        'image-path-in-domain',
        [...VMI_PLACEHOLDERS, 'path', 'basename'],
      ),
      ...((get('publish-dir') ?? preset.publishDir) !== undefined
        ? { publishDir: checkTemplate((get('publish-dir') ?? preset.publishDir)!, 'publish-dir') }
        : {}),
      resumeVia: oneOf(get('resume-via') ?? preset.resumeVia, 'resume-via', ['virsh', 'kubevirt'] as const),
      diskBus: oneOf(get('disk-bus') ?? preset.diskBus, 'disk-bus', ['virtio', 'scsi'] as const),
      virshTimeoutMs: parseDuration(get('virsh-timeout') ?? '30s', 'virsh-timeout'),
    },
    maxUserDataBytes: parseIntFlag(
      get('max-user-data-bytes') ?? String(DEFAULT_MAX_USER_DATA_BYTES),
      'max-user-data-bytes',
      1,
      64 * 1024 * 1024,
    ),
    maxNetworkDataBytes: parseIntFlag(
      get('max-network-data-bytes') ?? String(DEFAULT_MAX_NETWORK_DATA_BYTES),
      'max-network-data-bytes',
      1,
      16 * 1024 * 1024,
    ),
    fsync: oneOf(get('fsync') ?? 'true', 'fsync', ['true', 'false'] as const) === 'true',
  };
  const vendorDataFrom = get('vendor-data-from');
  if (vendorDataFrom !== undefined) config.vendorDataFrom = checked(() => parseVendorDataFrom(vendorDataFrom));
  const namespaces = get('namespaces');
  if (namespaces !== undefined) {
    if (local) throw new ConfigError('--namespaces needs a cluster; local mode reads its directory');
    config.namespaces = parseNamespaces(namespaces);
    if (config.vendorDataFrom && !config.namespaces.includes(config.vendorDataFrom.namespace)) {
      throw new ConfigError(
        `--vendor-data-from: namespace '${config.vendorDataFrom.namespace}' is not in --namespaces; the agent can only read ConfigMaps there`,
      );
    }
  }
  const datasource = datasourceConfig(
    get,
    values['datasource-compat-source-address'] === true || env[envName('datasource-compat-source-address')] === 'true',
    cwd,
  );
  if (datasource) config.datasource = datasource;
  if (values['datasource-imds-compat'] === true || env[envName('datasource-imds-compat')] === 'true') {
    if (!datasource)
      throw new ConfigError(
        '--datasource-imds-compat needs --datasource-listen HOST:PORT (the datasource is off without it)',
      );
    datasource.imdsCompat = true;
  }
  const redirectStatusUrl = get('redirect-status-url');
  if (redirectStatusUrl !== undefined)
    config.redirectStatusUrl = checked(() => parseRedirectStatusUrl(redirectStatusUrl));
  if (local && platform === 'kubevirt') {
    throw new ConfigError(
      "--platform kubevirt needs a cluster (KubeVirt's VMI status and unpause API); local mode uses --platform libvirt",
    );
  }
  if (local && config.libvirt.resumeVia === 'kubevirt') {
    throw new ConfigError(
      "--resume-via kubevirt needs a cluster (KubeVirt's unpause API); local mode resumes with virsh",
    );
  }
  if (platform === 'kubevirt' && config.libvirt.resumeVia === 'virsh') {
    throw new ConfigError(
      '--resume-via virsh cannot be used with --platform kubevirt: KubeVirt resumes any pause it did not order and keeps its own pause record; the seed gate unpauses through KubeVirt',
    );
  }
  if (config.libvirt.mode === 'rpc' && !rpcDialable(config.libvirt.uri)) {
    throw new ConfigError(
      `--libvirt rpc: '${config.libvirt.uri}' is not a local qemu URI (qemu:///system, qemu:///session, qemu+unix:///…?socket=PATH) the RPC client can dial; use --libvirt virsh for other transports`,
    );
  }
  const socket = LAUNCHER_SOCKET(podsDir, '00000000-0000-0000-0000-000000000000');
  if (config.libvirt.uri === preset.uri && platform === 'kubevirt' && Buffer.byteLength(socket) > MAX_SOCKET_PATH) {
    throw new ConfigError(
      `--pods-dir: '${podsDir}' makes the launcher socket path ${Buffer.byteLength(socket)} bytes, over the ${MAX_SOCKET_PATH} a unix socket path may have; mount the kubelet's pods directory at a shorter path such as /pods`,
    );
  }
  return deepFreeze(config);
}

// `a,b`: DNS-1123 labels (what a namespace name is), each once.
const MAX_NAMESPACES = 100;
export function parseNamespaces(text: string): string[] {
  const names = text.split(',').map((n) => n.trim());
  if (names.length > MAX_NAMESPACES)
    throw new ConfigError(`--namespaces: ${names.length} namespaces; at most ${MAX_NAMESPACES} (two watches each)`);
  for (const n of names) {
    if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(n)) {
      throw new ConfigError(
        `--namespaces: '${n}' is not a namespace name (lowercase letters, digits and '-', at most 63); separate names with commas`,
      );
    }
  }
  return [...new Set(names)];
}

// A VmseedError from a shared parser becomes the one-line ConfigError.
function checked<T>(fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    throw new ConfigError((e as Error).message);
  }
}

function datasourceConfig(
  get: (flag: keyof typeof OPTIONS) => string | undefined,
  compat: boolean,
  cwd: string,
): DatasourceConfig | undefined {
  const listen = get('datasource-listen');
  if (listen === undefined) {
    for (const flag of ['datasource-key-file', 'datasource-base-url'] as const) {
      if (get(flag) !== undefined)
        throw new ConfigError(`--${flag} needs --datasource-listen HOST:PORT (the datasource is off without it)`);
    }
    if (compat)
      throw new ConfigError(
        '--datasource-compat-source-address needs --datasource-listen HOST:PORT (the datasource is off without it)',
      );
    return undefined;
  }
  const keyFile = get('datasource-key-file');
  if (keyFile === undefined) {
    throw new ConfigError(
      "--datasource-key-file FILE is required with --datasource-listen; create one with 'openssl rand -base64 32 > FILE'",
    );
  }
  const baseUrl = (get('datasource-base-url') ?? DEFAULT_DATASOURCE_BASE).replace(/\/+$/, '');
  let prefix: string;
  try {
    datasourceSeedUrl(baseUrl, 'token');
    prefix = normalisePrefix(new URL(baseUrl).pathname);
  } catch (e) {
    throw new ConfigError(`--datasource-base-url: ${(e as Error).message}`);
  }
  return {
    listen: parseListen(listen, 'datasource-listen'),
    keyFile: resolve(cwd, keyFile),
    baseUrl,
    prefix,
    compatSourceAddress: compat,
  };
}

// What the status page shows: no credentials (the kubeconfig path only).
export function configSummary(c: Config): Record<string, string | number | boolean> {
  return {
    mode: c.mode,
    ...(c.localDir ? { localDir: c.localDir } : {}),
    nodeName: c.nodeName,
    stateDir: c.stateDir,
    listen: `${c.listen.host}:${c.listen.port}`,
    statusListen: `${c.statusListen.host}:${c.statusListen.port}`,
    concurrency: c.concurrency,
    kubevirtVolumes: c.kubevirtVolumes,
    resyncPeriodSeconds: c.resyncPeriodMs / 1000,
    shutdownTimeoutSeconds: c.shutdownTimeoutMs / 1000,
    libvirt: c.libvirt.mode,
    ...(c.libvirt.mode !== 'off'
      ? {
          platform: c.libvirt.platform,
          ...(c.libvirt.platform === 'kubevirt' ? { podsDir: c.libvirt.podsDir } : {}),
          libvirtUri: c.libvirt.uri,
          domainName: c.libvirt.domainName,
          imagePathInDomain: c.libvirt.imagePathInDomain,
          ...(c.libvirt.publishDir ? { publishDir: c.libvirt.publishDir } : {}),
          resumeVia: c.libvirt.resumeVia,
          diskBus: c.libvirt.diskBus,
          virshTimeoutSeconds: c.libvirt.virshTimeoutMs / 1000,
        }
      : {}),
    logLevel: c.logLevel,
    fsync: c.fsync,
    ...(c.redirectStatusUrl ? { redirectStatusUrl: c.redirectStatusUrl } : {}),
    ...(c.namespaces ? { namespaces: c.namespaces.join(',') } : {}),
    ...(c.vendorDataFrom
      ? {
          vendorDataFrom: `${c.vendorDataFrom.namespace}/${c.vendorDataFrom.name}${c.vendorDataFrom.key ? `/${c.vendorDataFrom.key}` : ''}`,
        }
      : {}),
    // The key file's path only, never its content.
    ...(c.datasource
      ? {
          datasourceListen: `${c.datasource.listen.host}:${c.datasource.listen.port}`,
          datasourceBaseUrl: c.datasource.baseUrl,
          datasourceKeyFile: c.datasource.keyFile,
          datasourceCompatSourceAddress: c.datasource.compatSourceAddress,
          ...(c.datasource.imdsCompat ? { datasourceImdsCompat: true } : {}),
        }
      : {}),
  };
}

function deepFreeze<T>(o: T): T {
  if (o && typeof o === 'object') {
    for (const v of Object.values(o)) deepFreeze(v);
    Object.freeze(o);
  }
  return o;
}
