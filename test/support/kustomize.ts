// Rendering the deployment variants with the real `kubectl kustomize`
// (see scripts/deb-packages.txt; components need kustomize ≥ 3.7, in kubectl
// since 1.21). A missing kubectl fails the test that needs it: there is no
// fallback renderer.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import * as yaml from 'js-yaml';
import type { KubeObject } from './manifests.ts';

const run = promisify(execFile);

export const OVERLAYS = ['kubevirt', 'libvirt', 'namespaced', 'imds'] as const;
export type Overlay = (typeof OVERLAYS)[number];
// deploy/components/<name>: kustomize Components an operator's overlay
// combines.
export const COMPONENTS = ['imds', 'namespaced', 'webhook'] as const;

// `dir` absolute, or relative to the current directory.
export async function kustomize(dir: string): Promise<KubeObject[]> {
  const { stdout } = await kustomizeText(dir);
  return yaml.loadAll(stdout).filter((d) => d !== null && d !== undefined) as KubeObject[];
}

// The rendered YAML and what kustomize printed beside it (its warnings).
export async function kustomizeText(dir: string): Promise<{ stdout: string; stderr: string }> {
  try {
    return await run('kubectl', ['kustomize', dir], { maxBuffer: 16 * 1024 * 1024, timeout: 60_000 });
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    if (err.code === 'ENOENT')
      throw new Error('kubectl is not on PATH: run scripts/setup-host.sh', {
        cause: e,
      });
    throw new Error(`kubectl kustomize ${dir} failed: ${(err.stderr ?? err.message).trim()}`, { cause: e });
  }
}

export async function kubectlVersion(): Promise<string> {
  const { stdout } = await run('kubectl', ['version', '--client'], { timeout: 30_000 });
  return stdout.trim().split('\n')[0];
}

// kind/namespace/name: how kustomize and the API server tell objects apart.
export function objectId(o: KubeObject): string {
  return `${o.kind}/${o.metadata.namespace ?? ''}/${o.metadata.name}`;
}
