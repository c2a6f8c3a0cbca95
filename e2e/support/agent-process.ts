// The real agent CLI (`node src/main.ts agent --local DIR --libvirt virsh`,
// or VMSEED_E2E_LIBVIRT's client; not imported from libvirt-mode.ts, which
// registers node:test hooks and the benchmarks use this file too)
// as a subprocess, for the whole-chain tests: manifests go into its local
// directory, its status page is read over HTTP, and it is always killed.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { AgentStatusSnapshot, VmiStatusRecord } from '../../src/status/snapshot.ts';
import { destroyDomain } from './libvirtd.ts';

const MAIN = new URL('../../src/main.ts', import.meta.url).pathname;

export interface AgentProcess {
  dir: string;
  manifests: string;
  stateDir: string;
  url: string;
  child: ChildProcess;
  log(): string;
  /** Atomic write (beside, then rename), as editors and kubectl-like tools do. */
  put(file: string, text: string): Promise<void>;
  remove(file: string): Promise<void>;
  status(): Promise<AgentStatusSnapshot>;
  vmi(namespace: string, name: string): Promise<VmiStatusRecord | undefined>;
  /** SIGTERM, then SIGKILL after 20 s; resolves with the exit code. */
  stop(): Promise<number | null>;
  /** Kills the agent if still running and removes its directory. Safe to call twice. */
  dispose(): Promise<void>;
}

export async function startAgentProcess(extraArgs: string[] = []): Promise<AgentProcess> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-e2e-agent-'));
  const manifests = join(dir, 'manifests');
  const stateDir = join(dir, 'seeds');
  await mkdir(manifests);
  const child = spawn(
    process.execPath,
    [
      MAIN,
      'agent',
      '--local',
      manifests,
      '--libvirt',
      process.env.VMSEED_E2E_LIBVIRT ?? 'virsh',
      '--state-dir',
      stateDir,
      '--listen',
      '127.0.0.1:0',
      '--log-level',
      'debug',
      '--fsync',
      'false',
      ...extraArgs,
    ],
    { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));

  const kill = async (): Promise<number | null> => {
    if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
    child.kill('SIGTERM');
    const t = setTimeout(() => child.kill('SIGKILL'), 20_000);
    try {
      return await exited;
    } finally {
      clearTimeout(t);
    }
  };
  const dispose = async () => {
    await kill();
    await rm(dir, { recursive: true, force: true });
  };

  let url: string | undefined;
  const deadline = Date.now() + 30_000;
  while (!(url = /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(log)?.[1])) {
    if (child.exitCode !== null || Date.now() > deadline) {
      await dispose();
      throw new Error(`the agent did not report its listen address; log:\n${log.slice(-3000)}`);
    }
    await sleep(50);
  }
  const status = async () => (await (await fetch(`${url}/status.json`)).json()) as AgentStatusSnapshot;
  return {
    dir,
    manifests,
    stateDir,
    url,
    child,
    log: () => log,
    put: async (file, text) => {
      const p = join(manifests, file);
      await writeFile(`${p}.partial`, text);
      await rename(`${p}.partial`, p);
    },
    remove: (file) => rm(join(manifests, file)),
    status,
    vmi: async (namespace, name) => (await status()).vmis.find((v) => v.namespace === namespace && v.name === name),
    stop: kill,
    dispose,
  };
}

export async function waitUntil<T>(
  what: string,
  fn: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs: number,
  detail?: () => string | Promise<string>,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail ? `\n${await detail()}` : ''}`);
    await sleep(100);
  }
}

export interface VmiYamlOptions {
  namespace: string;
  name: string;
  /** The vmseed.io/cloud-init annotation document (YAML). */
  cloudInit?: string;
  /** Instead: KubeVirt's own cloudInitNoCloud volume (local mode owns such volumes). */
  noCloudVolume?: { userData: string };
  resumeAfterSeed?: boolean;
  firmwareUuid?: string;
}

// The annotation document is embedded as a JSON string: no YAML indentation
// games, and user-data bytes survive exactly.
export function vmiYaml(o: VmiYamlOptions): string {
  const annotations: Record<string, string> = {};
  if (o.cloudInit !== undefined) annotations['vmseed.io/cloud-init'] = o.cloudInit;
  if (o.resumeAfterSeed) annotations['vmseed.io/resume-after-seed'] = 'true';
  const domain: Record<string, unknown> = o.firmwareUuid ? { firmware: { uuid: o.firmwareUuid } } : {};
  const spec: Record<string, unknown> = { domain };
  if (o.noCloudVolume) {
    domain.devices = { disks: [{ name: 'cloudinit', disk: { bus: 'virtio' } }] };
    spec.volumes = [{ name: 'cloudinit', cloudInitNoCloud: { userData: o.noCloudVolume.userData } }];
  }
  return (
    JSON.stringify(
      {
        apiVersion: 'kubevirt.io/v1',
        kind: 'VirtualMachineInstance',
        metadata: { name: o.name, namespace: o.namespace, annotations },
        spec,
      },
      null,
      2,
    ) + '\n'
  );
}

// Destroys and undefines a test domain, then checks that its QEMU is gone
// (libvirt names the process `-name guest=<domain>,...`).
export async function removeDomainChecked(domain: string): Promise<void> {
  await destroyDomain(domain);
  const deadline = Date.now() + 15_000;
  for (;;) {
    const left = await qemuProcessesOf(domain);
    if (left.length === 0) return;
    if (Date.now() > deadline)
      throw new Error(`QEMU of domain ${domain} still running after destroy: pids ${left.join(', ')}`);
    await sleep(200);
  }
}

async function qemuProcessesOf(domain: string): Promise<string[]> {
  return new Promise((resolve) => {
    execFile('pgrep', ['-f', `guest=${domain},`], (err, stdout) =>
      resolve(
        err
          ? []
          : stdout
              .trim()
              .split('\n')
              .filter((l) => l !== ''),
      ),
    );
  });
}

// Runs every cleanup step even when one fails, then reports the first failure.
export async function cleanupAll(...steps: Array<() => Promise<unknown>>): Promise<void> {
  const errors: unknown[] = [];
  for (const s of steps) {
    try {
      await s();
    } catch (e) {
      errors.push(e);
    }
  }
  if (errors.length > 0) throw errors[0];
}
