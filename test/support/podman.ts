// Real containers for the image tests: Debian's buildah builds the Dockerfile
// and podman runs the image with runc, under a pod's security context read
// from the manifest. No container registry is reachable here, so the
// Dockerfile's FROM image is made by scripts/image-base.sh.
import { execFile } from 'node:child_process';
import { writeFileSync, mkdirSync, copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

// podman and buildah read this file (CONTAINERS_CONF). Root here cannot
// raise a hard rlimit and podman asks for more than this host's by default
// (setrlimit: Operation not permitted), so the containers get the hard
// limits the test itself runs with. crun cannot run on this host's mixed
// cgroup layout; runc can, and applies the memory and CPU limits.
export async function containersEnv(dir: string): Promise<NodeJS.ProcessEnv> {
  const { stdout } = await run('bash', ['-c', 'ulimit -Hn; ulimit -Hu']);
  const [nofile, nproc] = stdout.trim().split('\n');
  const procs = nproc === 'unlimited' ? 32768 : Math.min(Number(nproc), 32768);
  const conf = join(dir, 'containers.conf');
  writeFileSync(
    conf,
    `[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${procs}:${procs}"]
[engine]
runtime = "runc"
events_logger = "file"
`,
  );
  return { ...process.env, CONTAINERS_CONF: conf };
}

export interface Output {
  stdout: string;
  stderr: string;
}

export async function podman(
  env: NodeJS.ProcessEnv,
  args: string[],
  options: { timeout?: number } = {},
): Promise<Output> {
  return run('podman', args, { env, timeout: options.timeout ?? 60_000, maxBuffer: 16 * 1024 * 1024 });
}

// Exit code and output, without rejecting on a non-zero exit.
export async function podmanStatus(
  env: NodeJS.ProcessEnv,
  args: string[],
): Promise<Output & { code: number | string }> {
  return podman(env, args).then(
    (r) => ({ ...r, code: 0 }),
    (e: Output & { code: number | string }) => ({ stdout: e.stdout, stderr: e.stderr, code: e.code }),
  );
}

// The build's `npm ci` reaches the npm registry through a chain this host's
// CA bundle completes; a fresh root filesystem has no such bundle. npm's
// global config under the image's prefix (/usr/local/etc/npmrc) names the
// bundle for the build only: the directory is a build-time mount, so
// nothing of it stays in the image.
export function npmBuildConfig(dir: string): string {
  const etc = join(dir, 'npm-etc');
  mkdirSync(etc);
  copyFileSync(process.env.NODE_EXTRA_CA_CERTS ?? '/etc/ssl/certs/ca-certificates.crt', join(etc, 'ca.crt'));
  writeFileSync(join(etc, 'npmrc'), 'cafile=/usr/local/etc/ca.crt\nupdate-notifier=false\nfund=false\naudit=false\n');
  return etc;
}

// --- a pod's security context as podman flags --------------------------------

interface SecurityContext {
  runAsUser?: number;
  runAsGroup?: number;
  runAsNonRoot?: boolean;
  supplementalGroups?: number[];
  seccompProfile?: { type: string };
  allowPrivilegeEscalation?: boolean;
  readOnlyRootFilesystem?: boolean;
  capabilities?: { drop?: string[]; add?: string[] };
}

export interface ContainerSpec {
  name: string;
  command?: string[];
  args?: string[];
  env?: { name: string; value?: string; valueFrom?: unknown }[];
  resources?: { limits?: { cpu?: string; memory?: string } };
  securityContext?: SecurityContext;
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean; mountPropagation?: string }[];
}

export interface PodSpec {
  terminationGracePeriodSeconds?: number;
  securityContext?: SecurityContext;
  containers: ContainerSpec[];
  volumes?: {
    name: string;
    emptyDir?: { medium?: string; sizeLimit?: string };
    hostPath?: unknown;
    secret?: unknown;
  }[];
}

// The fields translated below; any other makes the translation throw, so a
// setting added to the manifest cannot be silently left out of the test.
const KNOWN = new Set([
  'runAsUser',
  'runAsGroup',
  'runAsNonRoot',
  'supplementalGroups',
  'seccompProfile',
  'allowPrivilegeEscalation',
  'readOnlyRootFilesystem',
  'capabilities',
]);

const BINARY: Record<string, number> = { '': 1, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30 };

export function bytes(quantity: string): number {
  const m = /^(\d+)(Ki|Mi|Gi)?$/.exec(quantity);
  if (!m) throw new Error(`unsupported quantity ${quantity}`);
  return Number(m[1]) * BINARY[m[2] ?? ''];
}

export function cpus(quantity: string): number {
  return quantity.endsWith('m') ? Number(quantity.slice(0, -1)) / 1000 : Number(quantity);
}

export interface RunAs {
  // Host directories for the hostPath and Secret volumes, by volume name.
  hostDirs: Record<string, string>;
  // Values of the env entries that Kubernetes fills from the pod (valueFrom).
  fieldValues: Record<string, string>;
}

// `podman run` flags for one container of the pod: user and groups,
// capabilities, no-new-privileges, read-only root, the emptyDirs as tmpfs
// mounts of their size limit, the other volumes as bind mounts, the limits,
// the env. The root filesystem gets no tmpfs of podman's own
// (--read-only-tmpfs=false): Kubernetes adds none either.
export function runFlags(pod: PodSpec, container: ContainerSpec, as: RunAs): string[] {
  const sc: SecurityContext = { ...pod.securityContext, ...container.securityContext };
  for (const key of Object.keys(sc)) if (!KNOWN.has(key)) throw new Error(`securityContext.${key}: not translated`);
  if (sc.runAsUser === undefined) throw new Error(`${container.name}: no runAsUser`);
  if (sc.runAsNonRoot === true && sc.runAsUser === 0) throw new Error(`${container.name}: runAsNonRoot as root`);
  if (sc.seccompProfile !== undefined && sc.seccompProfile.type !== 'RuntimeDefault')
    throw new Error(`seccompProfile ${sc.seccompProfile.type}: not translated`);
  const flags = [`--user=${sc.runAsUser}:${sc.runAsGroup ?? 0}`];
  for (const g of pod.securityContext?.supplementalGroups ?? []) flags.push(`--group-add=${g}`);
  if (sc.allowPrivilegeEscalation === false) flags.push('--security-opt=no-new-privileges');
  if (sc.readOnlyRootFilesystem === true) flags.push('--read-only', '--read-only-tmpfs=false');
  for (const c of sc.capabilities?.drop ?? []) flags.push(`--cap-drop=${c.toLowerCase()}`);
  for (const c of sc.capabilities?.add ?? []) flags.push(`--cap-add=${c.toLowerCase()}`);
  const limits = container.resources?.limits ?? {};
  if (limits.memory !== undefined) flags.push(`--memory=${bytes(limits.memory)}`);
  if (limits.cpu !== undefined) flags.push(`--cpus=${cpus(limits.cpu)}`);
  for (const mount of container.volumeMounts ?? []) {
    const volume = pod.volumes?.find((v) => v.name === mount.name);
    if (volume === undefined) throw new Error(`${container.name}: no volume ${mount.name}`);
    if (volume.emptyDir !== undefined) {
      const size = volume.emptyDir.sizeLimit === undefined ? '' : `,size=${bytes(volume.emptyDir.sizeLimit)}`;
      flags.push(`--tmpfs=${mount.mountPath}:rw,mode=1777${size}`);
    } else {
      const dir = as.hostDirs[mount.name];
      if (dir === undefined) throw new Error(`${container.name}: no host directory for volume ${mount.name}`);
      const options = [mount.readOnly === true || volume.secret !== undefined ? 'ro' : 'rw'];
      if (mount.mountPropagation === 'HostToContainer') options.push('rslave');
      flags.push(`--volume=${dir}:${mount.mountPath}:${options.join(',')}`);
    }
  }
  for (const e of container.env ?? []) {
    const value = e.value ?? as.fieldValues[e.name];
    if (value === undefined) throw new Error(`${container.name}: no value for env ${e.name}`);
    flags.push(`--env=${e.name}=${value}`);
  }
  return flags;
}

// Kubernetes expands $(VAR) in command and args from the container's env.
export function expandArgs(args: string[], env: Record<string, string>): string[] {
  return args.map((a) => a.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, name: string) => env[name] ?? m));
}

// The pod's env as the container sees it (values and field references).
export function envOf(container: ContainerSpec, as: RunAs): Record<string, string> {
  return Object.fromEntries((container.env ?? []).map((e) => [e.name, e.value ?? as.fieldValues[e.name]]));
}
