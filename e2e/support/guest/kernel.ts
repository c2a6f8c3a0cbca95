// The guest kernel: Debian's linux-image-*-cloud-amd64 extracted (not
// installed) from the package apt offers, cached by package name + version.
import { readdir, readFile, rename, rm } from 'node:fs/promises';
import path from 'node:path';
import { cachedFixture } from './cache.ts';
import { run } from './exec.ts';

export interface KernelFixture {
  /** Absolute path of vmlinuz. */
  vmlinuz: string;
  /** e.g. 6.1.0-56-cloud-amd64 */
  version: string;
  /** <dir>/lib/modules/<version> */
  modulesDir: string;
  package: string;
  packageVersion: string;
}

const META_PACKAGE = 'linux-image-cloud-amd64';

/** The concrete linux-image-6.1.0-N-cloud-amd64 that apt would install, and its version (one apt-cache call: ~0.7 s). */
export async function resolveKernelPackage(): Promise<{ name: string; version: string }> {
  const show = await run('apt-cache', ['show', '--no-all-versions', META_PACKAGE]);
  const m = /^Depends:.*?\b(linux-image-6\.1\.0-[0-9]+-cloud-amd64) \(= ([^)\s]+)\)/m.exec(show.stdout);
  if (!m)
    throw new Error(
      `apt-cache show ${META_PACKAGE} names no linux-image-6.1.0-*-cloud-amd64 (= version) (run apt-get update)`,
    );
  return { name: m[1], version: m[2] };
}

let kernelOnce: Promise<KernelFixture> | undefined;

/** Memoized per process: the apt queries behind the cache key cost about a second. */
export function ensureKernel(): Promise<KernelFixture> {
  kernelOnce ??= buildKernel().catch((e) => {
    kernelOnce = undefined;
    throw e;
  });
  return kernelOnce;
}

async function buildKernel(): Promise<KernelFixture> {
  const pkg = await resolveKernelPackage();
  const { dir } = await cachedFixture('kernel', { package: pkg.name, version: pkg.version, layout: 1 }, async (tmp) => {
    const dl = path.join(tmp, 'download');
    await run('mkdir', ['-p', dl]);
    await run('apt-get', ['download', `${pkg.name}=${pkg.version}`], { cwd: dl, timeoutMs: 300_000 });
    const debs = (await readdir(dl)).filter((f) => f.endsWith('.deb'));
    if (debs.length !== 1) throw new Error(`apt-get download left ${debs.length} .deb files in ${dl}`);
    const x = path.join(tmp, 'x');
    await run('dpkg-deb', ['-x', path.join(dl, debs[0]), x], { timeoutMs: 300_000 });
    const boot = await readdir(path.join(x, 'boot'));
    const vmlinuz = boot.find((f) => f.startsWith('vmlinuz-'));
    if (!vmlinuz) throw new Error(`no vmlinuz in ${pkg.name}`);
    await rename(path.join(x, 'boot', vmlinuz), path.join(tmp, 'vmlinuz'));
    await rename(path.join(x, 'lib'), path.join(tmp, 'lib'));
    await rm(x, { recursive: true, force: true });
    await rm(dl, { recursive: true, force: true });
  });
  const versions = await readdir(path.join(dir, 'lib', 'modules'));
  if (versions.length !== 1) throw new Error(`expected one kernel version under ${dir}/lib/modules`);
  return {
    vmlinuz: path.join(dir, 'vmlinuz'),
    version: versions[0],
    modulesDir: path.join(dir, 'lib', 'modules', versions[0]),
    package: pkg.name,
    packageVersion: pkg.version,
  };
}

const normalize = (n: string) => n.replace(/-/g, '_');

/** Map module name -> path of its .ko, relative to modulesDir. */
async function indexModules(modulesDir: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const entries = await readdir(path.join(modulesDir, 'kernel'), { recursive: true });
  for (const rel of entries) {
    const m = /([^/]+)\.ko(\.xz|\.zst|\.gz)?$/.exec(rel);
    if (!m) continue;
    if (m[2]) throw new Error(`compressed module ${rel}: busybox insmod cannot load it`);
    out.set(normalize(m[1]), path.join('kernel', rel));
  }
  return out;
}

/** The `depends=` field of a module's .modinfo section (NUL-separated key=value strings). */
function modinfoDepends(ko: Buffer): string[] {
  const needle = Buffer.from('\0depends=');
  const at = ko.indexOf(needle);
  if (at < 0) return [];
  const start = at + needle.length;
  const end = ko.indexOf(0, start);
  const value = ko.subarray(start, end).toString('latin1');
  return value ? value.split(',').map(normalize) : [];
}

/**
 * Resolves `wanted` modules plus their dependencies (read from each module's
 * modinfo, since the package ships no modules.dep and the host has no depmod)
 * into load order, dependencies first. Built-in modules are skipped.
 */
export async function resolveModules(
  modulesDir: string,
  wanted: readonly string[],
): Promise<{ name: string; rel: string }[]> {
  const index = await indexModules(modulesDir);
  const builtin = new Set(
    (await readFile(path.join(modulesDir, 'modules.builtin'), 'utf8'))
      .split('\n')
      .filter(Boolean)
      .map((l) => normalize(path.basename(l).replace(/\.ko$/, ''))),
  );
  const order: { name: string; rel: string }[] = [];
  const state = new Map<string, 'visiting' | 'done'>();
  const visit = async (raw: string): Promise<void> => {
    const name = normalize(raw);
    if (state.get(name) === 'done' || builtin.has(name)) return;
    if (state.get(name) === 'visiting') throw new Error(`module dependency cycle at ${name}`);
    const rel = index.get(name);
    if (!rel) throw new Error(`kernel module ${name} not found under ${modulesDir} (and not built in)`);
    state.set(name, 'visiting');
    for (const dep of modinfoDepends(await readFile(path.join(modulesDir, rel)))) await visit(dep);
    state.set(name, 'done');
    order.push({ name, rel });
  };
  for (const w of wanted) await visit(w);
  return order;
}
