// Starts `bin/vmseed agent` the way manifests/daemonset.yaml runs it on a
// node, read from the manifest itself (not restated here), or another of
// the pod's containers (`container`: the imds variant's redirect, an init
// container):
// - the container's command (the image's ENTRYPOINT, `vmseed agent`, when
//   it has none), args and env (NODE_NAME from spec.nodeName, HOST_IP from
//   status.hostIP), with the kubelet's $(VAR) expansion;
// - the pod + container securityContext: runAsUser, runAsGroup,
//   supplementalGroups, capabilities (drop ALL → empty inheritable and
//   bounding sets), allowPrivilegeEscalation=false → no_new_privs, applied
//   with setpriv (setprivOptions, also used by test/deploy for the rendered
//   variants);
// - in a network namespace of the test's (`netns`), standing for the
//   pod's, or the node's for a hostNetwork pod;
// - the container's volumeMounts in a private mount namespace: hostPath
//   volumes bound from the test's stand-ins (/var/lib/kubelet/pods → the
//   replica's pods tree), emptyDirs as tmpfs, Secrets from a test directory,
//   readOnly mounts and readOnlyRootFilesystem as read-only bind remounts;
//   configMap and projected volumes from test directories (`volumeDirs`);
// - a Deployment's pod template too (the cluster component), when the
//   objects hold no DaemonSet; its `tini --` prefix is dropped (no tini here);
// - with `dnsDir`, cluster DNS for Service names (cluster-dns-preload.ts).
// Only listeners and the API server connection are overridden by the test.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, realpathSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile, chmod } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import * as yaml from 'js-yaml';

const ROOT = new URL('../../', import.meta.url).pathname;
export const DAEMONSET = join(ROOT, 'manifests/daemonset.yaml');
const VMSEED = join(ROOT, 'bin/vmseed');
const DNS_PRELOAD = new URL('../../test/support/cluster-dns-preload.ts', import.meta.url).href;

interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: { fieldRef?: { fieldPath?: string } };
}

export interface Volume {
  name: string;
  hostPath?: { path: string; type?: string };
  emptyDir?: { medium?: string; sizeLimit?: string };
  secret?: { secretName: string; defaultMode?: number; items?: Array<{ key: string; path: string }> };
  configMap?: { name: string };
  projected?: { sources: unknown[] };
}

export interface AgentMount {
  name: string;
  mountPath: string;
  readOnly: boolean;
  volume: Volume;
}

export interface DaemonSetAgent {
  /** The container's command; absent: the image's ENTRYPOINT, `vmseed agent`. */
  command?: string[];
  /** They follow the command. */
  args: string[];
  env: EnvVar[];
  runAsUser: number;
  runAsGroup: number;
  supplementalGroups: number[];
  capabilities: { drop: string[]; add: string[] };
  allowPrivilegeEscalation: boolean;
  readOnlyRootFilesystem: boolean;
  mounts: AgentMount[];
}

type Obj = Record<string, unknown>;

function num(v: unknown, what: string): number {
  if (typeof v !== 'number' || !Number.isInteger(v)) throw new Error(`daemonset: ${what} is not set to an integer`);
  return v;
}

export function readDaemonSetAgent(path = DAEMONSET): DaemonSetAgent {
  return daemonSetAgentOf(yaml.loadAll(readFileSync(path, 'utf8')), path);
}

/** The agent container (or `name`, an init container too) of the one DaemonSet among already-loaded objects (e.g. a `kubectl kustomize` rendering). */
export function daemonSetAgentOf(objects: readonly unknown[], path = 'manifests', name = 'agent'): DaemonSetAgent {
  let docs = (objects as Obj[]).filter((d) => d && d.kind === 'DaemonSet');
  // No DaemonSet: the one Deployment (the cluster component's pod template).
  if (docs.length === 0) docs = (objects as Obj[]).filter((d) => d && d.kind === 'Deployment');
  if (docs.length !== 1) throw new Error(`${path}: expected one DaemonSet, found ${docs.length}`);
  const podSpec = ((docs[0].spec as Obj).template as Obj).spec as Obj;
  const container = [...((podSpec.initContainers ?? []) as Obj[]), ...(podSpec.containers as Obj[])].find(
    (c) => c.name === name,
  );
  if (!container) throw new Error(`${path}: no container named ${name}`);
  const pod = (podSpec.securityContext ?? {}) as Obj;
  const sc = (container.securityContext ?? {}) as Obj;
  const caps = (sc.capabilities ?? {}) as { drop?: string[]; add?: string[] };
  const volumes = new Map(((podSpec.volumes ?? []) as Volume[]).map((v) => [v.name, v]));
  const mounts = ((container.volumeMounts ?? []) as Array<{ name: string; mountPath: string; readOnly?: boolean }>).map(
    (m) => {
      const volume = volumes.get(m.name);
      if (!volume) throw new Error(`${path}: volumeMount ${m.name} has no volume`);
      return { name: m.name, mountPath: m.mountPath, readOnly: m.readOnly === true, volume };
    },
  );
  // The container's securityContext wins over the pod's (Kubernetes' rule).
  return {
    ...(container.command ? { command: (container.command as unknown[]).map(String) } : {}),
    args: ((container.args ?? []) as unknown[]).map(String),
    env: (container.env ?? []) as EnvVar[],
    runAsUser: num(sc.runAsUser ?? pod.runAsUser, 'runAsUser'),
    runAsGroup: num(sc.runAsGroup ?? pod.runAsGroup, 'runAsGroup'),
    supplementalGroups: ((pod.supplementalGroups ?? []) as unknown[]).map((g) => num(g, 'supplementalGroups[]')),
    capabilities: { drop: caps.drop ?? [], add: caps.add ?? [] },
    allowPrivilegeEscalation: sc.allowPrivilegeEscalation !== false,
    readOnlyRootFilesystem: sc.readOnlyRootFilesystem === true,
    mounts,
  };
}

function flagName(arg: string): string | undefined {
  const m = /^--([a-z0-9-]+)(=|$)/.exec(arg);
  return m?.[1];
}

/** Replaces (or appends) `--flag=value` for each override; all manifest args use the `=` form. */
export function withOverrides(args: string[], overrides: Record<string, string>): string[] {
  for (const a of args)
    if (a.startsWith('--') && !a.includes('=') && overrides[flagName(a) ?? ''] !== undefined)
      throw new Error(`daemonset arg ${a} is not in --flag=value form; cannot override it`);
  const kept = args.filter((a) => overrides[flagName(a) ?? ''] === undefined);
  return [...kept, ...Object.entries(overrides).map(([k, v]) => `--${k}=${v}`)];
}

/**
 * setpriv options (without the command name) for the container's user,
 * groups and capability set. Only what the vmseed manifests use is
 * replicated, `drop: [ALL]` with nothing added, or added ones for root:
 * anything else throws, so a manifest change cannot silently run under
 * another identity than the cluster would give it (an added capability only
 * reaches a non-root process through ambient capabilities, which
 * Kubernetes does not set).
 */
export function setprivOptions(d: DaemonSetAgent): string[] {
  const dropAll = d.capabilities.drop.some((c) => c.toUpperCase() === 'ALL');
  if (!dropAll || (d.capabilities.add.length > 0 && d.runAsUser !== 0))
    throw new Error(
      'daemonset: the container must drop ALL capabilities and add none, or add some as root (the only sets replicated)',
    );
  const added = d.capabilities.add.map((c) => `,+${c.toLowerCase().replace(/^cap_/, '')}`).join('');
  return [
    `--reuid=${d.runAsUser}`,
    `--regid=${d.runAsGroup}`,
    d.supplementalGroups.length > 0 ? `--groups=${d.supplementalGroups.join(',')}` : '--clear-groups',
    // Nothing inheritable; the bounding set holds only what is added (none:
    // even root gets no capability across exec; some: root's permitted and
    // effective sets are those, as the container runtime gives them).
    '--inh-caps=-all',
    `--bounding-set=-all${added}`,
    ...(d.allowPrivilegeEscalation ? [] : ['--no-new-privs']),
  ];
}

// The agent's listeners on loopback at port 0: the kernel picks a free port
// in the agent's own bind, so no other process can take it between a pick
// and the listen (as with a port picked here, closed, then handed over).
// The status listener on another loopback address keeps the two HTTP
// listeners apart, as the manifest has them (one address makes them one).
// Where they listen is read back from the agent's log (listenerUrls).
export const LOOPBACK_LISTENERS: Readonly<Record<string, string>> = Object.freeze({
  listen: '127.0.0.1:0',
  'status-listen': '127.0.0.2:0',
  'datasource-listen': '127.0.0.1:0',
});

export interface ListenerUrls {
  /** --listen: /healthz, /readyz, /metrics. */
  probes: string;
  /** --status-listen: the status page, /status.json. */
  status: string;
  /** --datasource-listen, without the prefix. */
  datasource: string;
}

interface ListeningLine {
  msg?: string;
  serve?: string;
  url?: string;
  address?: string;
  port?: number;
}

// The agent's complete JSON log lines that say where it listens (the last
// line may still be being written).
function logLines(log: string): ListeningLine[] {
  const lines: ListeningLine[] = [];
  for (const text of log.split('\n').slice(0, -1)) {
    // Only the few listening lines are parsed (the log of a large node is long).
    if (!text.startsWith('{') || !text.includes(' listening"')) continue;
    try {
      lines.push(JSON.parse(text) as ListeningLine);
    } catch {
      /* not a log record */
    }
  }
  return lines;
}

function urlsIn(lines: ListeningLine[]): Partial<ListenerUrls> {
  const urls: Partial<ListenerUrls> = {};
  for (const l of lines) {
    if (l.msg === 'http server listening' && l.url) {
      if (l.serve === 'probes' || l.serve === 'all') urls.probes = l.url;
      if (l.serve === 'status' || l.serve === 'all') urls.status = l.url;
    }
    if (l.msg === 'NoCloud HTTP datasource listening' && l.address && l.port)
      urls.datasource = `http://${l.address.includes(':') ? `[${l.address}]` : l.address}:${l.port}`;
  }
  return urls;
}

/** Where the agent started with LOOPBACK_LISTENERS listens, once its log says so; fails fast when it exits. */
export async function listenerUrls(agent: DaemonSetAgentProcess, timeoutMs: number): Promise<ListenerUrls> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const urls = urlsIn(logLines(agent.log()));
    if (urls.probes && urls.status && urls.datasource) return urls as ListenerUrls;
    if (agent.exited())
      throw new Error(
        `the agent exited (code ${agent.child.exitCode}) before it listened; log:\n${agent.log().slice(-4000)}`,
      );
    if (Date.now() > deadline)
      throw new Error(`the agent did not log its listeners within ${timeoutMs} ms; log:\n${agent.log().slice(-4000)}`);
    await sleep(100);
  }
}

export type KubeAccess =
  | { kubeconfig: string }
  /** saDir holds token, ca.crt, namespace; bound at /var/run/secrets/kubernetes.io/serviceaccount. */
  | { inCluster: { host: string; port: number; saDir: string } };

export interface StartOptions {
  /** Stand-ins for the manifest's hostPath volumes, by host path (e.g. /var/lib/kubelet/pods → the replica's pods dir). */
  hostPaths: Record<string, string>;
  /** Directories standing for Secret volumes, by secret name. */
  secrets?: Record<string, string>;
  nodeName: string;
  kube: KubeAccess;
  /** Test overrides of single flags, e.g. { listen: '127.0.0.1:1234' }. */
  overrides: Record<string, string>;
  extraEnv?: Record<string, string>;
  manifest?: string;
  /** The objects to read the DaemonSet from, instead of `manifest`. */
  objects?: readonly unknown[];
  /** The container to start (default the agent). */
  container?: string;
  /** status.hostIP for the Downward API. */
  hostIP?: string;
  /** A network namespace (`ip netns`) to run in. */
  netns?: string;
  /** A compile cache warmed as the image build warms it (`vmseed warm-cache` as the pod's user). */
  compileCache?: string;
  /** Directories standing for configMap and projected volumes, by volume name. */
  volumeDirs?: Record<string, string>;
  /** status.podIP for the Downward API. */
  podIP?: string;
  /** Cluster DNS's records (cluster-dns.ts): bound at /run/vmseed-dns, read by a preload. */
  dnsDir?: string;
}

export interface DaemonSetAgentProcess {
  spec: DaemonSetAgent;
  argv: string[];
  child: ChildProcess;
  log(): string;
  exited(): boolean;
  stop(): Promise<number | null>;
}

// Mounts in the agent's namespace, as root, before dropping to the pod's
// user. Every source is first bound under a fresh /run (the stand-ins live
// under the host's /tmp, which an emptyDir at /tmp would hide), then onto
// its mount path. Mount points must exist on the host; they are created empty.
function mountScript(
  spec: DaemonSetAgent,
  o: StartOptions,
  extraDir: string,
): { script: string; mountPoints: string[] } {
  const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
  const lines = ['set -eu', 'mount -t tmpfs -o mode=0755 tmpfs /run'];
  const sources: string[] = [];
  const staged = (src: string): string => {
    const at = `/run/vmseed-src/${sources.length}`;
    sources.push(src);
    lines.push(`mkdir -p ${at}`, `mount --bind ${q(src)} ${at}`);
    return at;
  };
  const test = staged(extraDir);
  // The checkout itself (bin/vmseed, src, node_modules) stands in for the
  // image's /opt/vmseed; a checkout under /tmp would be hidden by the tmp
  // emptyDir, so it is bound back at its own path, read-only, after them.
  const repo = staged(ROOT.replace(/\/+$/, ''));
  const cache = o.compileCache ? staged(o.compileCache) : undefined;
  const sa = 'inCluster' in o.kube ? staged(o.kube.inCluster.saDir) : undefined;
  const dns = o.dnsDir ? staged(o.dnsDir) : undefined;
  const plan: string[] = [];
  const mountPoints: string[] = [];
  for (const m of spec.mounts) {
    mountPoints.push(m.mountPath);
    // Under /run (e.g. /var/run/libvirt) the point is on the fresh tmpfs.
    plan.push(`mkdir -p ${q(m.mountPath)}`);
    const v = m.volume;
    if (v.hostPath) {
      const src = o.hostPaths[v.hostPath.path];
      if (!src) throw new Error(`no stand-in for hostPath ${v.hostPath.path} (volume ${v.name})`);
      plan.push(`mount --bind ${staged(src)} ${q(m.mountPath)}`);
    } else if (v.emptyDir) {
      const size = v.emptyDir.sizeLimit ? `,size=${v.emptyDir.sizeLimit.replace(/i$/, '')}` : '';
      // Kubernetes makes emptyDirs 0777 (no fsGroup on this pod).
      plan.push(`mount -t tmpfs -o mode=0777${size} tmpfs ${q(m.mountPath)}`);
    } else if (v.secret) {
      const src = o.secrets?.[v.secret.secretName];
      if (!src) throw new Error(`no stand-in for Secret ${v.secret.secretName} (volume ${v.name})`);
      plan.push(`mount --bind ${staged(src)} ${q(m.mountPath)}`);
    } else if ((v.configMap || v.projected) && o.volumeDirs?.[v.name]) {
      plan.push(`mount --bind ${staged(o.volumeDirs[v.name])} ${q(m.mountPath)}`);
    } else {
      throw new Error(
        `volume ${v.name}: only hostPath, emptyDir, secret, configMap and projected volumes are replicated`,
      );
    }
    if (m.readOnly || v.secret || v.configMap || v.projected) plan.push(`mount -o remount,bind,ro ${q(m.mountPath)}`);
  }
  if (spec.readOnlyRootFilesystem) lines.push('mount -o remount,bind,ro /');
  lines.push(...plan);
  const root = q(ROOT.replace(/\/+$/, ''));
  lines.push(`mkdir -p ${root}`, `mount --bind ${repo} ${root}`, `mount -o remount,bind,ro ${root}`);
  // Where the image keeps the compile cache it warmed at build (bin/vmseed's
  // node_modules/.cache/vmseed), read-only as the image's root filesystem.
  if (cache) {
    const at = q(join(realpathSync(join(ROOT, 'node_modules')), '.cache', 'vmseed'));
    lines.push(`mount --bind ${cache} ${at}`, `mount -o remount,bind,ro ${at}`);
  }
  // Test-only files (kubeconfig) and the service account, read-only.
  lines.push('mkdir -p /run/vmseed-test /run/secrets/kubernetes.io/serviceaccount');
  lines.push(`mount --bind ${test} /run/vmseed-test`, 'mount -o remount,bind,ro /run/vmseed-test');
  if (sa)
    lines.push(
      `mount --bind ${sa} /run/secrets/kubernetes.io/serviceaccount`,
      'mount -o remount,bind,ro /run/secrets/kubernetes.io/serviceaccount',
    );
  if (dns)
    lines.push(
      'mkdir -p /run/vmseed-dns',
      `mount --bind ${dns} /run/vmseed-dns`,
      'mount -o remount,bind,ro /run/vmseed-dns',
    );
  for (let i = 0; i < sources.length; i++) lines.push(`umount /run/vmseed-src/${i}`);
  lines.push('exec "$@"');
  return { script: lines.join('\n'), mountPoints };
}

// The kubelet's expansion of $(VAR) in command and args with the container's
// environment: an undefined VAR stays as written, $$ escapes.
export function expandVars(text: string, env: Record<string, string>): string {
  return text.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m: string, name: string | undefined) =>
    name === undefined ? '$' : (env[name] ?? m),
  );
}

export async function startDaemonSetAgent(o: StartOptions): Promise<DaemonSetAgentProcess> {
  const spec = o.objects
    ? daemonSetAgentOf(o.objects, 'objects', o.container)
    : o.container
      ? daemonSetAgentOf(yaml.loadAll(readFileSync(o.manifest ?? DAEMONSET, 'utf8')), o.manifest, o.container)
      : readDaemonSetAgent(o.manifest);
  const extraDir = await mkdtemp(join(tmpdir(), 'vmseed-ds-agent-'));
  await chmod(extraDir, 0o755);
  // VMSEED_E2E_LIBVIRT: the same replica on the other libvirt client.
  const overrides: Record<string, string> = {
    ...(process.env.VMSEED_E2E_LIBVIRT ? { libvirt: process.env.VMSEED_E2E_LIBVIRT } : {}),
    ...o.overrides,
  };
  const env: Record<string, string> = { PATH: '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' };
  for (const e of spec.env) {
    if (e.value !== undefined) env[e.name] = e.value;
    else if (e.valueFrom?.fieldRef?.fieldPath === 'spec.nodeName') env[e.name] = o.nodeName;
    else if (e.valueFrom?.fieldRef?.fieldPath === 'status.hostIP' && o.hostIP) env[e.name] = o.hostIP;
    else if (e.valueFrom?.fieldRef?.fieldPath === 'status.podIP' && o.podIP) env[e.name] = o.podIP;
    else
      throw new Error(
        `daemonset env ${e.name}: only literal values, spec.nodeName and (given hostIP, podIP) status.hostIP, status.podIP are replicated`,
      );
  }
  if ('kubeconfig' in o.kube) {
    await writeFile(join(extraDir, 'kubeconfig'), readFileSync(o.kube.kubeconfig), { mode: 0o644 });
    overrides.kubeconfig = '/run/vmseed-test/kubeconfig';
  } else {
    env.KUBERNETES_SERVICE_HOST = o.kube.inCluster.host;
    env.KUBERNETES_SERVICE_PORT = String(o.kube.inCluster.port);
  }
  Object.assign(env, o.extraEnv ?? {});
  const args = withOverrides(spec.args, overrides).map((a) => expandVars(a, env));
  // The pod's resolv.conf pointing at cluster DNS: Service names resolve
  // through the preload (Node processes only, which is all `vmseed` runs).
  if (o.dnsDir) env.NODE_OPTIONS = [env.NODE_OPTIONS, `--import=${DNS_PRELOAD}`].filter(Boolean).join(' ');
  // `vmseed` is bin/vmseed, as on the image's PATH; the image's tini (the
  // cluster component's `tini --`) is not replicated.
  const written = spec.command ?? ['vmseed', 'agent'];
  const command = (written[0] === 'tini' && written[1] === '--' ? written.slice(2) : written)
    .map((a) => expandVars(a, env))
    .map((a, i) => (i === 0 && a === 'vmseed' ? VMSEED : a));
  if (o.compileCache)
    await mkdir(join(realpathSync(join(ROOT, 'node_modules')), '.cache', 'vmseed'), { recursive: true });
  const { script, mountPoints } = mountScript(spec, o, extraDir);
  for (const p of mountPoints) await mkdir(p, { recursive: true });
  const argv = [
    ...(o.netns ? ['ip', 'netns', 'exec', o.netns] : []),
    'unshare',
    '-m',
    '--propagation',
    'private',
    'sh',
    '-c',
    script,
    'sh',
    // Test-only: the agent goes when the test process goes.
    'setpriv',
    ...setprivOptions(spec),
    '--pdeathsig',
    'TERM',
    'env',
    '-i',
    ...Object.entries(env).map(([k, v]) => `${k}=${v}`),
    ...command,
    ...args,
  ];
  // unshare and sh exec into setpriv, env, bin/vmseed and Node: the child's
  // pid is the agent's, and SIGTERM reaches it.
  const child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  const exit = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  return {
    spec,
    argv,
    child,
    log: () => log,
    exited: () => child.exitCode !== null || child.signalCode !== null,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 20_000);
        try {
          await exit;
        } finally {
          clearTimeout(t);
        }
      }
      await rm(extraDir, { recursive: true, force: true });
      return child.exitCode;
    },
  };
}

/** Polls url until it answers 200, failing fast when the agent exits. */
export async function waitHealthy(agent: DaemonSetAgentProcess, url: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (agent.exited())
      throw new Error(
        `the agent exited (code ${agent.child.exitCode}) before ${url} answered; log:\n${agent.log().slice(-4000)}`,
      );
    try {
      const r = await fetch(url);
      if (r.ok) return;
    } catch {
      /* not listening yet */
    }
    if (Date.now() > deadline)
      throw new Error(`${url} did not answer 200 within ${timeoutMs} ms; log:\n${agent.log().slice(-4000)}`);
    await sleep(100);
  }
}
