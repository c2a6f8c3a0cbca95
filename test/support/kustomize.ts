// Rendering the deployment variants with the real `kubectl kustomize`
// (see scripts/deb-packages.txt; components need kustomize ≥ 3.7, in kubectl
// since 1.21). A missing kubectl fails the test that needs it: there is no
// fallback renderer.
import { execFile } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import * as yaml from 'js-yaml';
import { ROOT, type KubeObject } from './manifests.ts';

const run = promisify(execFile);

export const OVERLAYS = ['kubevirt', 'libvirt', 'namespaced', 'imds', 'single-tenant'] as const;
export type Overlay = (typeof OVERLAYS)[number];
// deploy/components/<name>: kustomize Components an operator's overlay
// combines.
export const COMPONENTS = ['imds', 'namespaced', 'webhook', 'direct-reads'] as const;
// Those an operator may list together in one overlay (direct-reads removes
// the cluster component the webhook is served by).
export const COMBINABLE = ['imds', 'namespaced', 'webhook'] as const;

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

// docs/operations.md, "Namespaced RBAC": the overlay an operator writes for
// namespaces of their own, its two files as the docs show them, written
// into `dir` with the paths to this repository pointed at this checkout.
// `components`: more of deploy/components to list beside namespaced.
export async function writeDocsNamespacedOverlay(dir: string, components: string[] = []): Promise<void> {
  const docs = await readFile(join(ROOT, 'docs', 'operations.md'), 'utf8');
  const start = docs.indexOf('### Namespaced RBAC');
  const section = docs.slice(start, docs.indexOf('\n## ', start));
  const files = new Map([...section.matchAll(/```yaml\n# (\S+)\n([\s\S]*?)```/g)].map((m) => [m[1], m[2]] as const));
  const kustomization = files.get('kustomization.yaml');
  const rolebindings = files.get('rolebindings.yaml');
  if (files.size !== 2 || kustomization === undefined || rolebindings === undefined)
    throw new Error(`docs/operations.md "Namespaced RBAC" shows ${[...files.keys()].join(', ')}, not the two files`);
  const here = (p: string) => relative(dir, join(ROOT, p));
  const namespaced = /^([ \t]*- )\S*deploy\/components\/namespaced\S*$/m;
  if (!namespaced.test(kustomization)) throw new Error("the docs' overlay lists no deploy/components/namespaced");
  await writeFile(
    join(dir, 'kustomization.yaml'),
    kustomization
      .replace(/\S*deploy\/kubevirt\S*/, here('deploy/kubevirt'))
      .replace(namespaced, (_m, item: string) =>
        ['namespaced', ...components].map((c) => `${item}${here(`deploy/components/${c}`)}`).join('\n'),
      ),
  );
  await writeFile(join(dir, 'rolebindings.yaml'), rolebindings);
}
