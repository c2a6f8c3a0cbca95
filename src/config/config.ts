// `vmseed agent` configuration: the flags of src/config/flags.ts with their
// environment fallbacks, validated once into one frozen object. A bad value
// is a ConfigError whose message is the single line printed before exiting 2.
import type { DatasourceConfig } from '../datasource/types.ts';
import type { RenderOptions } from '../cloudinit/render.ts';
import type { CiProfile } from '../cloudinit/schema/ci-validator.ts';
import type { VendorDataRef } from '../cloudinit/userdata/vendor-data.ts';
import { readFlags, type FlagReader } from './flag-reader.ts';
import { LAUNCHER_SOCKET, rpcDialable, type LibvirtMode, type LogLevel, type Platform } from './flags.ts';
import { ConfigError } from './values.ts';
import type { Template } from '../libvirt/template.ts';

export { ConfigError } from './values.ts';
export { AGENT_USAGE } from './usage.ts';
export type { DatasourceConfig, LibvirtMode, LogLevel, Platform };
export type KubevirtVolumes = RenderOptions['kubevirtVolumes'];

/**
 * The agent's validated configuration, made by loadConfig from the flags and
 * their environment fallbacks; durations in ms, sizes in bytes.
 */
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
  // The kubeconfig's context, when not its current-context.
  context?: string;
  // Secrets and ConfigMaps read through the cluster component's object
  // service (--objects-url) instead of the API server.
  objects?: { url: string; tokenFile: string; caFile?: string };
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
    uri: Template<'uri'>;
    domainName: Template<'domain'>;
    imagePathInDomain: Template<'image-path'>;
    // Copy images into this per-VMI directory for the domain (KubeVirt: a
    // `vmseed` directory in the launcher pod's ephemeral-disks emptyDir; its
    // last component is created when missing); absent: used in place.
    publishDir?: Template<'publish-dir'>;
    // How the seed gate resumes a paused domain.
    resumeVia: 'virsh' | 'kubevirt';
    diskBus: 'virtio' | 'scsi';
    virshTimeoutMs: number;
  };
  maxUserDataBytes: number;
  maxNetworkDataBytes: number;
  // fsync each image and its directory before the rename is final (crash safety).
  fsync: boolean;
  // Seeds ask cloud-init to post its progress to the datasource listener
  // (src/agent/provisioning/report-plan.ts).
  reportProgress: boolean;
  // Cluster mode: the VMI annotation vmseed.io/provisioning is kept
  // (src/agent/provisioning/summary.ts).
  provisioningAnnotation: boolean;
  // NoCloud over HTTP (absent: off).
  datasource?: DatasourceConfig;
  // Operator-wide vendor-data ConfigMap (RenderOptions.defaultVendorData).
  vendorDataFrom?: VendorDataRef;
  // cloud-init's schemas (RenderOptions.schemaCheck): where they are, and
  // the release checked against by default ('off': no check).
  cloudInitSchemas: string;
  cloudInitVersion: CiProfile | 'off';
  // Namespaced mode: watch and read only these (absent: cluster-wide).
  namespaces?: string[];
  // The redirect sidecar's /readyz, polled for the status page only.
  redirectStatusUrl?: string;
  // Where the agent writes its launcher pod addresses for the redirect.
  launcherAddressesFile?: string;
}

// sun_path holds 108 bytes with the terminating NUL.
const MAX_SOCKET_PATH = 107;

/**
 * Reads and checks the agent's flags (`env` for fallbacks, `cwd` for relative
 * paths); throws ConfigError on a bad value and returns undefined for --help.
 * The flags are read in a fixed order, so of several bad values the same one is
 * reported every time.
 */
export function loadConfig(argv: string[], env: NodeJS.ProcessEnv, cwd: string): Config | undefined {
  const flags = readFlags(argv, env, cwd);
  if (!flags) return undefined;
  const local = flags.local;
  const localDir = flags.get('local');
  const nodeName = flags.get('node-name');
  const stateDir = flags.get('state-dir');
  const listen = flags.get('listen');
  const platform = flags.get('platform');
  const podsDir = flags.get('pods-dir');
  const config: Config = {
    mode: local ? 'local' : 'kubernetes',
    statusListen: flags.get('status-listen'),
    ...(localDir !== undefined ? { localDir } : {}),
    nodeName,
    stateDir,
    listen,
    ...optional('kubeconfig', flags.get('kubeconfig')),
    ...optional('context', flags.get('context')),
    concurrency: flags.get('concurrency'),
    kubevirtVolumes: flags.get('kubevirt-volumes'),
    resyncPeriodMs: flags.get('resync-period'),
    shutdownTimeoutMs: flags.get('shutdown-timeout'),
    logLevel: flags.get('log-level'),
    libvirt: {
      mode: flags.get('libvirt'),
      platform,
      podsDir,
      virshPath: flags.get('virsh-path'),
      uri: flags.get('libvirt-uri'),
      domainName: flags.get('domain-name'),
      imagePathInDomain: flags.get('image-path-in-domain'),
      ...optional('publishDir', flags.get('publish-dir')),
      resumeVia: flags.get('resume-via'),
      diskBus: flags.get('disk-bus'),
      virshTimeoutMs: flags.get('virsh-timeout'),
    },
    maxUserDataBytes: flags.get('max-user-data-bytes'),
    maxNetworkDataBytes: flags.get('max-network-data-bytes'),
    fsync: flags.get('fsync'),
    reportProgress: flags.get('report-progress'),
    provisioningAnnotation: flags.get('provisioning-annotation'),
    cloudInitSchemas: flags.get('cloud-init-schemas'),
    cloudInitVersion: flags.get('cloud-init-version'),
  };
  if (config.context !== undefined && config.kubeconfig === undefined)
    throw new ConfigError('--context: needs --kubeconfig (or KUBECONFIG); the in-cluster config has no contexts');
  const vendorDataFrom = flags.get('vendor-data-from');
  if (vendorDataFrom !== undefined) config.vendorDataFrom = vendorDataFrom;
  if (flags.given('namespaces') !== undefined) {
    if (local) throw new ConfigError('--namespaces needs a cluster; local mode reads its directory');
    const namespaces = flags.get('namespaces')!;
    config.namespaces = namespaces;
    if (config.vendorDataFrom && !namespaces.includes(config.vendorDataFrom.namespace)) {
      throw new ConfigError(
        `--vendor-data-from: namespace '${config.vendorDataFrom.namespace}' is not in --namespaces; the agent can only read ConfigMaps there`,
      );
    }
  }
  const objectsUrl = flags.get('objects-url');
  if (objectsUrl !== undefined) {
    if (local) throw new ConfigError('--objects-url needs a cluster; local mode reads its directory');
    config.objects = {
      url: objectsUrl,
      tokenFile: flags.get('objects-token-file'),
      ...optional('caFile', flags.get('objects-ca-file')),
    };
  }
  const datasource = datasourceConfig(flags);
  if (datasource) config.datasource = datasource;
  if (flags.get('datasource-imds-compat')) {
    if (!datasource)
      throw new ConfigError(
        '--datasource-imds-compat needs --datasource-listen HOST:PORT (the datasource is off without it)',
      );
    datasource.imdsCompat = true;
  }
  const imdsSession = flags.get('datasource-imds-session');
  if (imdsSession !== 'off') {
    if (!datasource)
      throw new ConfigError(
        '--datasource-imds-session needs --datasource-listen HOST:PORT (the datasource is off without it)',
      );
    datasource.imdsSession = imdsSession;
  }
  const redirectStatusUrl = flags.get('redirect-status-url');
  if (redirectStatusUrl !== undefined) config.redirectStatusUrl = redirectStatusUrl;
  const launcherAddressesFile = flags.get('launcher-addresses-file');
  if (launcherAddressesFile !== undefined) config.launcherAddressesFile = launcherAddressesFile;
  checkCombinations(config, flags);
  return deepFreeze(config);
}

function optional<K extends string, T>(key: K, value: T | undefined): Partial<Record<K, T>> {
  return value === undefined ? {} : ({ [key]: value } as Record<K, T>);
}

// What single flags cannot say on their own.
function checkCombinations(config: Config, flags: FlagReader): void {
  const { platform, resumeVia, mode, uri, podsDir } = config.libvirt;
  if (config.mode === 'local' && platform === 'kubevirt') {
    throw new ConfigError(
      "--platform kubevirt needs a cluster (KubeVirt's VMI status and unpause API); local mode uses --platform libvirt",
    );
  }
  const gate = resumeViaProblem(config.mode, platform, resumeVia);
  if (gate) throw new ConfigError(gate);
  if (mode === 'rpc' && !rpcDialable(uri)) {
    throw new ConfigError(
      `--libvirt rpc: '${uri}' is not a local qemu URI (qemu:///system, qemu:///session, qemu+unix:///…?socket=PATH) the RPC client can dial; use --libvirt virsh for other transports`,
    );
  }
  const socket = LAUNCHER_SOCKET(podsDir, '00000000-0000-0000-0000-000000000000');
  if (
    uri === flags.defaultText('libvirt-uri') &&
    platform === 'kubevirt' &&
    Buffer.byteLength(socket) > MAX_SOCKET_PATH
  ) {
    throw new ConfigError(
      `--pods-dir: '${podsDir}' makes the launcher socket path ${Buffer.byteLength(socket)} bytes, over the ${MAX_SOCKET_PATH} a unix socket path may have; mount the kubelet's pods directory at a shorter path such as /pods`,
    );
  }
}

function datasourceConfig(flags: FlagReader): DatasourceConfig | undefined {
  const compat = flags.get('datasource-compat-source-address');
  if (flags.given('datasource-listen') === undefined) {
    for (const flag of ['datasource-key-file', 'datasource-key-create', 'datasource-base-url'] as const) {
      if (flags.given(flag) !== undefined)
        throw new ConfigError(`--${flag} needs --datasource-listen HOST:PORT (the datasource is off without it)`);
    }
    if (compat)
      throw new ConfigError(
        '--datasource-compat-source-address needs --datasource-listen HOST:PORT (the datasource is off without it)',
      );
    return undefined;
  }
  const keyFile = flags.get('datasource-key-file');
  if (keyFile === undefined) {
    throw new ConfigError(
      "--datasource-key-file FILE is required with --datasource-listen; create one with 'openssl rand -base64 32 > FILE' (one per node), or give --datasource-key-create true",
    );
  }
  const { baseUrl, prefix } = flags.get('datasource-base-url');
  return {
    listen: flags.get('datasource-listen')!,
    keyFile,
    ...(flags.get('datasource-key-create') ? { keyCreate: true } : {}),
    baseUrl,
    prefix,
    compatSourceAddress: compat,
    podsDir: flags.get('pods-dir'),
  };
}

/**
 * What the status page shows of the configuration: no credentials (the
 * kubeconfig path only).
 */
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
    reportProgress: c.reportProgress,
    cloudInitVersion: c.cloudInitVersion,
    cloudInitSchemas: c.cloudInitSchemas,
    ...(c.mode === 'kubernetes' ? { provisioningAnnotation: c.provisioningAnnotation } : {}),
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
          ...(c.datasource.keyCreate ? { datasourceKeyCreate: true } : {}),
          datasourceCompatSourceAddress: c.datasource.compatSourceAddress,
          ...(c.datasource.imdsCompat ? { datasourceImdsCompat: true } : {}),
          ...(c.datasource.imdsSession ? { datasourceImdsSession: c.datasource.imdsSession } : {}),
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

// What a configuration cannot do with the seed gate, as the flag error says it.
function resumeViaProblem(
  mode: 'local' | 'kubernetes',
  platform: 'libvirt' | 'kubevirt',
  resumeVia: 'virsh' | 'kubevirt',
): string | undefined {
  if (mode === 'local' && resumeVia === 'kubevirt')
    return "--resume-via kubevirt needs a cluster (KubeVirt's unpause API); local mode resumes with virsh";
  if (platform === 'kubevirt' && resumeVia === 'virsh')
    return '--resume-via virsh cannot be used with --platform kubevirt: KubeVirt resumes any pause it did not order and keeps its own pause record; the seed gate unpauses through KubeVirt';
  return undefined;
}
