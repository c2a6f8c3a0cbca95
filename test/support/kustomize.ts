// Rendering the deployment variants with the real `kubectl kustomize`
// (Debian's kubernetes-client, or the Kubernetes project's kubectl; see
// scripts/deb-packages.txt). A missing kubectl fails the test that needs it:
// there is no fallback renderer.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import * as yaml from 'js-yaml';
import type { KubeObject } from './manifests.ts';

const run = promisify(execFile);

export const OVERLAYS = ['kubevirt', 'libvirt', 'namespaced', 'imds'] as const;
export type Overlay = (typeof OVERLAYS)[number];

// `dir` absolute, or relative to the current directory.
export async function kustomize(dir: string): Promise<KubeObject[]> {
  let stdout: string;
  try {
    ({ stdout } = await run('kubectl', ['kustomize', dir], { maxBuffer: 16 * 1024 * 1024, timeout: 60_000 }));
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    if (err.code === 'ENOENT')
      throw new Error('kubectl is not on PATH: run scripts/setup-host.sh (Debian package kubernetes-client)', {
        cause: e,
      });
    throw new Error(`kubectl kustomize ${dir} failed: ${(err.stderr ?? err.message).trim()}`, { cause: e });
  }
  return yaml.loadAll(stdout).filter((d) => d !== null && d !== undefined) as KubeObject[];
}

export async function kubectlVersion(): Promise<string> {
  const { stdout } = await run('kubectl', ['version', '--client'], { timeout: 30_000 });
  return stdout.trim().split('\n')[0];
}

// kind/namespace/name: how kustomize and the API server tell objects apart.
export function objectId(o: KubeObject): string {
  return `${o.kind}/${o.metadata.namespace ?? ''}/${o.metadata.name}`;
}
