// The flags of `vmseed agent`, one entry each: its value's name in --help,
// its environment variable, its defaults (per mode or per --platform), its
// help text and the check that turns its text into a value. Parsing,
// `--help` and the README check all read this table.
import { hostname } from 'node:os';
import { resolve } from 'node:path';
import { parseVendorDataFrom } from '../cloudinit/userdata/vendor-data.ts';
import {
  CLOUD_INIT_RELEASES,
  DEFAULT_CLOUD_INIT_RELEASE,
  DEFAULT_SCHEMA_DIR,
} from '../cloudinit/schema/schema-store.ts';
import { DEFAULT_MAX_NETWORK_DATA_BYTES, DEFAULT_MAX_USER_DATA_BYTES } from '../cloudinit/limits.ts';
import { normalisePrefix } from '../datasource/nocloud-paths.ts';
import { DEFAULT_DATASOURCE_BASE, datasourceSeedUrl } from '../datasource/url.ts';
import { SESSION_MODES } from '../datasource/imds/session-endpoint.ts';
import { localUriSocket } from '../libvirt/rpc/uri.ts';
import { encodeUriValue, parseTemplate, type TemplateKind } from '../libvirt/template.ts';
import {
  ConfigError,
  checked,
  oneOf,
  parseDuration,
  parseListen,
  parseNamespaces,
  parseRedirectStatusUrl,
  parseWholeNumber,
} from './values.ts';

// What a default needs of the other flags: the mode and their values.
export interface DefaultContext {
  readonly local: boolean;
  // The flag's text, given or its default.
  text(flag: string): string | undefined;
  value(flag: string): unknown;
}

// A default is parsed as though it were given. A computed one (`text` a
// function) or one without a value says in `doc` what it is, for --help and
// the README; a literal one with a `doc` too is shown as both.
export type Default = string | { text?: string | ((c: DefaultContext) => string | undefined); doc: string };

export interface FlagSpec<T> {
  // The value's name in --help; absent: a switch, true when given (or when
  // its environment variable is `true`).
  arg?: string;
  // Only where it is not VMSEED_<FLAG>.
  env?: string;
  help: string;
  // After the default in --help's parentheses.
  note?: string;
  default?: Default;
  byMode?: { cluster: Default; local: Default };
  byPlatform?: { kubevirt: Default; libvirt: Default };
  // No value at all is a valid setting (the feature is off).
  optional?: boolean;
  // The message when there is no value (a flag without a default in some mode).
  required?: string;
  parse(text: string, flag: string, cwd: string): T;
}

function flag<T>(spec: FlagSpec<T>): FlagSpec<T> {
  return spec;
}

function optionalFlag<T>(spec: Omit<FlagSpec<T>, 'optional'>): FlagSpec<T> & { optional: true } {
  return { ...spec, optional: true };
}

export const PLATFORMS = ['kubevirt', 'libvirt'] as const;
export type Platform = (typeof PLATFORMS)[number];
export const LIBVIRT_MODES = ['off', 'virsh', 'rpc'] as const;
// virsh: one `virsh` process per call (works wherever virsh does); rpc:
// libvirt's RPC protocol over one long-lived socket per URI, with domain
// events (local unix sockets only).
export type LibvirtMode = (typeof LIBVIRT_MODES)[number];
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

// Paths inside a launcher pod as the kubelet lays it out on the node
// (emptyDirs under volumes/kubernetes.io~empty-dir/<volume name>; KubeVirt
// names them libvirt-runtime and ephemeral-disks).
const EMPTY_DIR = 'volumes/kubernetes.io~empty-dir';
export const LAUNCHER_SOCKET = (podsDir: string, pod: string) =>
  `${podsDir}/${pod}/${EMPTY_DIR}/libvirt-runtime/virtqemud-sock`;

// A kubevirt preset under --pods-dir; `encode` for a directory put into a URI.
function underPodsDir(template: string, encode = (dir: string) => dir): Default {
  return { text: (c) => template.replace('{pods-dir}', () => encode(String(c.value('pods-dir')))), doc: template };
}

// The URIs the RPC client dials itself (src/libvirt/rpc/uri.ts); others
// (ssh, tls, tcp) need virsh.
export function rpcDialable(uriTemplate: string): boolean {
  return localUriSocket(uriTemplate) !== undefined;
}

const path = (text: string, _flag: string, cwd: string) => resolve(cwd, text);
const asGiven = (t: string) => t;
const choice =
  <T extends string>(allowed: readonly T[]) =>
  (t: string, f: string) =>
    oneOf(t, f, allowed);
// The per-VMI templates of the libvirt side, checked here once (template.ts).
const template =
  <K extends TemplateKind>(kind: K) =>
  (t: string, f: string) =>
    parseTemplate(kind, t, (problem) => new ConfigError(`--${f}: ${problem}`));
const switched = (t: string) => t === 'true';
const mib = (n: number) => `${n / 1024 / 1024} MiB`;

const NODE_NAME_REQUIRED =
  '--node-name (or NODE_NAME) is required in cluster mode; set it from spec.nodeName in the DaemonSet';

// In --help's order.
export const AGENT_FLAGS = {
  local: optionalFlag({
    arg: 'DIR',
    help: 'run on a directory of YAML manifests instead of a cluster',
    parse: path,
  }),
  'node-name': flag({
    arg: 'NAME',
    env: 'NODE_NAME',
    help: 'this node',
    byMode: { cluster: { doc: 'required' }, local: { text: () => hostname(), doc: 'the hostname' } },
    required: NODE_NAME_REQUIRED,
    parse: (t, f) => {
      // `--node-name ''` names no node, in local mode too.
      if (t === '') throw new ConfigError(NODE_NAME_REQUIRED);
      if (!/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(t))
        throw new ConfigError(`--${f}: '${t}' is not a valid Kubernetes node name`);
      return t;
    },
  }),
  'state-dir': flag({
    arg: 'DIR',
    help: 'where seed images go',
    byMode: { cluster: '/var/lib/vmseed/seeds', local: './var/seeds' },
    parse: path,
  }),
  listen: flag({
    arg: 'HOST:PORT',
    help: '/healthz, /readyz, /metrics',
    byMode: { cluster: '0.0.0.0:8080', local: '127.0.0.1:8080' },
    parse: parseListen,
  }),
  'status-listen': flag({
    arg: 'HOST:PORT',
    help: "status page, /status.json, /status/NS/NAME: every VMI's names and errors; one listener when it is the --listen address",
    byMode: { cluster: '127.0.0.1:8090', local: { text: (c) => c.text('listen'), doc: 'the --listen address' } },
    parse: parseListen,
  }),
  kubeconfig: optionalFlag({
    arg: 'FILE',
    env: 'KUBECONFIG',
    help: "the Kubernetes API credentials: a kubeconfig, or a ':'-separated list merged as kubectl merges KUBECONFIG (exec plugins, OIDC and proxy-url work)",
    default: { doc: 'in-cluster config' },
    parse: path,
  }),
  context: optionalFlag({
    arg: 'NAME',
    help: 'the kubeconfig context to use',
    default: { doc: "the kubeconfig's current-context" },
    parse: asGiven,
  }),
  concurrency: flag({
    arg: 'N',
    help: 'reconciles in parallel',
    default: '4',
    parse: (t, f) => parseWholeNumber(t, f, 1, 256),
  }),
  'kubevirt-volumes': flag({
    arg: 'own|ignore',
    help: "read VMIs' cloudInitNoCloud/ConfigDrive volumes",
    byMode: { cluster: 'ignore', local: 'own' },
    parse: choice(['own', 'ignore'] as const),
  }),
  'resync-period': flag({
    arg: 'DURATION',
    help: 're-check every VMI this often',
    default: '10m',
    note: 'e.g. 30s, 5m, 1h',
    parse: parseDuration,
  }),
  'shutdown-timeout': flag({
    arg: 'DURATION',
    help: 'after SIGTERM, how long in-flight work may run before the agent exits anyway',
    default: '20s',
    note: 'keep ~5s under terminationGracePeriodSeconds',
    parse: parseDuration,
  }),
  libvirt: flag({
    arg: 'off|virsh|rpc',
    help: "inject seeds into libvirt domains: virsh (a virsh process per call) or rpc (libvirt's protocol on one socket per URI, domain events; local sockets only)",
    byMode: {
      cluster: {
        text: (c) => (rpcDialable(c.text('libvirt-uri')!) ? 'rpc' : 'virsh'),
        doc: 'rpc (virsh when --libvirt-uri is not a local qemu URI)',
      },
      local: 'off',
    },
    parse: choice(LIBVIRT_MODES),
  }),
  platform: flag({
    arg: 'kubevirt|libvirt',
    help: 'the defaults of the libvirt side; the flags below override single values',
    byMode: { cluster: 'kubevirt', local: 'libvirt' },
    parse: choice(PLATFORMS),
  }),
  'pods-dir': flag({
    arg: 'DIR',
    help: "the kubelet's /var/lib/kubelet/pods as mounted here",
    default: '/pods',
    parse: path,
  }),
  'virsh-path': flag({ arg: 'PATH', help: 'the virsh program', default: 'virsh', parse: asGiven }),
  'libvirt-uri': flag({
    arg: 'TEMPLATE',
    help: "where a VMI's libvirt is reached: the launcher's socket as KubeVirt connects to it, or the host's",
    byPlatform: {
      // How KubeVirt itself reaches a non-root launcher's virtqemud; the
      // directory is percent-encoded as the rest of the URI's values are.
      kubevirt: underPodsDir(
        `qemu+unix:///session?socket=${LAUNCHER_SOCKET('{pods-dir}', '{podUID}')}`,
        encodeUriValue,
      ),
      libvirt: 'qemu:///system',
    },
    parse: template('uri'),
  }),
  'domain-name': flag({
    arg: 'TEMPLATE',
    help: 'libvirt domain of a VMI',
    default: '{namespace}_{name}',
    note: 'as KubeVirt names them',
    parse: template('domain'),
  }),
  'image-path-in-domain': flag({
    arg: 'TEMPLATE',
    help: "image path as the domain sees it ({path}: this host's)",
    byPlatform: { kubevirt: '/var/run/kubevirt-ephemeral-disks/vmseed/{basename}', libvirt: '{path}' },
    parse: template('image-path'),
  }),
  'publish-dir': optionalFlag({
    arg: 'TEMPLATE',
    help: 'copy each image into this directory for its domain, created when its parent exists',
    byPlatform: {
      // The launcher's ephemeral-disks emptyDir (mounted there at
      // /var/run/kubevirt-ephemeral-disks): outside hotplug-disks, whose
      // foreign disks KubeVirt's launcher detaches on every sync.
      kubevirt: underPodsDir(`{pods-dir}/{podUID}/${EMPTY_DIR}/ephemeral-disks/vmseed`),
      libvirt: { doc: 'none: the image is used where it is' },
    },
    parse: template('publish-dir'),
  }),
  'resume-via': flag({
    arg: 'virsh|kubevirt',
    help: 'how the seed gate resumes a paused VM; --platform kubevirt allows kubevirt only',
    byPlatform: { kubevirt: 'kubevirt', libvirt: 'virsh' },
    parse: choice(['virsh', 'kubevirt'] as const),
  }),
  'disk-bus': flag({
    arg: 'virtio|scsi',
    help: 'bus of the seed disk: scsi sdzz (virtio vdzz when the domain has no virtio-scsi controller), virtio vdzz',
    byPlatform: { kubevirt: 'scsi', libvirt: 'virtio' },
    parse: choice(['virtio', 'scsi'] as const),
  }),
  'virsh-timeout': flag({
    arg: 'DURATION',
    help: 'per libvirt call, virsh or rpc',
    default: '30s',
    parse: parseDuration,
  }),
  'log-level': flag({
    arg: 'LEVEL',
    help: LOG_LEVELS.join('|'),
    default: 'info',
    parse: choice(LOG_LEVELS),
  }),
  fsync: flag({
    arg: 'true|false',
    help: 'fsync images before they replace the old ones',
    default: 'true',
    parse: (t, f) => oneOf(t, f, ['true', 'false'] as const) === 'true',
  }),
  'max-user-data-bytes': flag({
    arg: 'N',
    help: 'largest user-data (and vendor-data) of a seed, after merging',
    default: { text: String(DEFAULT_MAX_USER_DATA_BYTES), doc: mib(DEFAULT_MAX_USER_DATA_BYTES) },
    parse: (t, f) => parseWholeNumber(t, f, 1, 64 * 1024 * 1024),
  }),
  'max-network-data-bytes': flag({
    arg: 'N',
    help: 'largest network data of a seed',
    default: { text: String(DEFAULT_MAX_NETWORK_DATA_BYTES), doc: mib(DEFAULT_MAX_NETWORK_DATA_BYTES) },
    parse: (t, f) => parseWholeNumber(t, f, 1, 16 * 1024 * 1024),
  }),
  'vendor-data-from': optionalFlag({
    arg: 'NS/NAME[/KEY]',
    help: "ConfigMap key (default vendor-data) used as every seed's vendor-data unless the VMI sets its own",
    parse: (t) => checked(() => parseVendorDataFrom(t)),
  }),
  'cloud-init-schemas': flag({
    arg: 'DIR',
    help: "cloud-init's JSON schemas per release (scripts/fetch-cloud-init-schemas.sh lays them out), which seeds' user-data, vendor-data and NoCloud network-config are checked against",
    default: DEFAULT_SCHEMA_DIR,
    parse: path,
  }),
  'cloud-init-version': flag({
    arg: 'RELEASE|off',
    help: `the cloud-init release seeds are checked against (${CLOUD_INIT_RELEASES.join(', ')}), unless a VMI names its own with the annotation vmseed.io/cloud-init-version; off: no check; problems are warnings, never a refused seed`,
    default: DEFAULT_CLOUD_INIT_RELEASE,
    parse: choice([...CLOUD_INIT_RELEASES, 'off'] as const),
  }),
  namespaces: optionalFlag({
    arg: 'NS[,NS...]',
    help: 'namespaced mode: watch VMIs and read Secrets/ConfigMaps only in these namespaces, with a Role per namespace',
    default: { doc: 'cluster-wide' },
    parse: parseNamespaces,
  }),
  'objects-url': optionalFlag({
    arg: 'URL',
    help: "read Secrets/ConfigMaps through the cluster component's node-scoped object service (`vmseed cluster`) instead of the API server",
    default: { doc: 'the API server' },
    parse: (t, f) => {
      if (!/^https:\/\/[^/?#\s]+\/?$/.test(t))
        throw new ConfigError(`--${f}: '${t}' is not an https://HOST[:PORT] URL`);
      return t.replace(/\/$/, '');
    },
  }),
  'objects-token-file': flag({
    arg: 'FILE',
    help: 'with --objects-url: the projected service-account token (audience vmseed-cluster) sent to it, re-read as it rotates',
    default: '/var/run/secrets/vmseed/objects/token',
    parse: path,
  }),
  'objects-ca-file': optionalFlag({
    arg: 'FILE',
    help: "with --objects-url: the CA that signed the object service's certificate",
    default: { doc: 'the system CAs' },
    parse: path,
  }),
  'datasource-listen': optionalFlag({
    arg: 'HOST:PORT',
    help: 'serve seeds as NoCloud over HTTP on this address',
    default: { doc: 'off' },
    parse: parseListen,
  }),
  'datasource-key-file': optionalFlag({
    arg: 'FILE',
    help: "this node's own keys for the tokens of VMI UIDs (`vmseed seed-url --uid`) and progress reports, one base64 key per line, signing key first; never share it between nodes (required with --datasource-listen; reloaded when it changes)",
    parse: path,
  }),
  'datasource-key-create': flag({
    arg: 'true|false',
    help: 'when --datasource-key-file does not exist at start, create it (mode 0640) with a fresh random key: a key of this node alone; its directory must exist',
    default: 'false',
    parse: (t, f) => oneOf(t, f, ['true', 'false'] as const) === 'true',
  }),
  'datasource-base-url': flag({
    arg: 'URL',
    help: 'the datasource as guests reach it',
    default: DEFAULT_DATASOURCE_BASE,
    parse: (t, f) => {
      const baseUrl = t.replace(/\/+$/, '');
      try {
        datasourceSeedUrl(baseUrl, 'token');
        return { baseUrl, prefix: normalisePrefix(new URL(baseUrl).pathname) };
      } catch (e) {
        throw new ConfigError(`--${f}: ${(e as Error).message}`);
      }
    },
  }),
  'datasource-imds-compat': flag({
    help: "answer token-less /v1/... by source address, for VMIs with KubeVirt IMDS's imds.kubevirt.io/enabled annotation only",
    default: 'false',
    parse: switched,
  }),
  'datasource-imds-session': flag({
    arg: 'off|optional|required',
    help: 'IMDSv2-style sessions (PUT /v1/session, header X-Vmseed-Session): optional checks a session sent with /v1/identity and /v1/token, required refuses them without one (KubeVirt IMDS clients send none); never on the NoCloud or OpenStack paths',
    default: 'off',
    parse: (t, f) => oneOf(t, f, SESSION_MODES),
  }),
  'redirect-status-url': optionalFlag({
    arg: 'URL',
    help: "the redirect sidecar's /readyz (e.g. http://$(HOST_IP):8082/readyz): polled for the status page, not part of the agent's own /readyz",
    parse: parseRedirectStatusUrl,
  }),
  'launcher-addresses-file': optionalFlag({
    arg: 'FILE',
    help: "write this node's launcher pod addresses here (atomically, when they change), for the redirect sidecar's --launchers-file: only they are redirected",
    parse: path,
  }),
  'datasource-compat-source-address': flag({
    help: "also answer token-less /v1/... by the caller's source address (weak identity: read the operations guide before enabling)",
    default: 'false',
    parse: switched,
  }),
  'report-progress': flag({
    arg: 'true|false',
    help: 'seeds turn on cloud-init\'s webhook reporting to the datasource listener (needs --datasource-listen and a key; a VMI opts out with vmseed.io/report-progress: "false")',
    default: 'true',
    parse: (t, f) => oneOf(t, f, ['true', 'false'] as const) === 'true',
  }),
  'provisioning-annotation': flag({
    arg: 'true|false',
    help: "cluster mode: keep each VMI's provisioning summary in its annotation vmseed.io/provisioning (a merge patch; needs patch on virtualmachineinstances)",
    default: 'true',
    parse: (t, f) => oneOf(t, f, ['true', 'false'] as const) === 'true',
  }),
};

// Flags the agent once had for a service that now runs elsewhere: given to
// the agent (or as VMSEED_<FLAG>), they are refused with where they went.
export const MOVED_FLAGS: Readonly<Record<string, string>> = {
  'webhook-listen': 'vmseed cluster',
  'webhook-cert-dir': 'vmseed cluster',
  'webhook-serial': 'vmseed cluster',
};

export type FlagName = keyof typeof AGENT_FLAGS;
type Spec<K extends FlagName> = (typeof AGENT_FLAGS)[K];
export type FlagValue<K extends FlagName> =
  ReturnType<Spec<K>['parse']> | (Spec<K> extends { optional: true } ? undefined : never);

// Environment fallbacks, one per flag: VMSEED_<FLAG> (NODE_NAME and
// KUBECONFIG keep their conventional names).
export function envName(name: FlagName): string {
  const spec: FlagSpec<unknown> = AGENT_FLAGS[name];
  return spec.env ?? `VMSEED_${name.toUpperCase().replaceAll('-', '_')}`;
}

// How --help and the README name a default.
export function docOf(d: Default): string {
  return typeof d === 'string' ? d : d.doc;
}
