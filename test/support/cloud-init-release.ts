// Another cloud-init release's Python package, for running its NoCloud code
// beside the installed one (Debian 12: 22.4). Taken from Debian trixie's
// cloud-init .deb (the release current Debian ships), extracted, never
// installed, cached like the guest fixtures. apt runs with a private state
// directory, so the host's sources and package lists are not touched.
import { mkdir, readdir, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { cachedFixture } from '../../e2e/support/guest/cache.ts';
import { run } from '../../e2e/support/guest/exec.ts';

export const CURRENT_CLOUD_INIT = { suite: 'trixie', version: '25.1.4-1+deb13u1' } as const;

let once: Promise<string> | undefined;

// The directory to put first on PYTHONPATH / sys.path.
export function ensureCloudInitRelease(): Promise<string> {
  once ??= build().catch((e) => {
    once = undefined;
    throw e;
  });
  return once;
}

async function build(): Promise<string> {
  const { dir } = await cachedFixture('cloud-init', { ...CURRENT_CLOUD_INIT, layout: 1 }, async (tmp) => {
    const state = path.join(tmp, 'apt');
    await mkdir(path.join(state, 'lists', 'partial'), { recursive: true });
    await writeFile(
      path.join(state, 'sources.list'),
      `deb http://deb.debian.org/debian ${CURRENT_CLOUD_INIT.suite} main\n`,
    );
    const opts = [
      '-o',
      `Dir::Etc::SourceList=${path.join(state, 'sources.list')}`,
      '-o',
      'Dir::Etc::SourceParts=/dev/null',
      '-o',
      `Dir::State::Lists=${path.join(state, 'lists')}`,
      '-o',
      `Dir::Cache=${path.join(state, 'cache')}`,
      '-o',
      'APT::Sandbox::User=root',
    ];
    await run('apt-get', ['-q', ...opts, 'update'], { timeoutMs: 300_000 });
    const dl = path.join(tmp, 'download');
    await mkdir(dl);
    // The pinned version, or (once a point release replaces it on the
    // mirror) whatever 25.1.x trixie carries: a fresh machine must still build it.
    await run('apt-get', ['-q', ...opts, 'download', `cloud-init=${CURRENT_CLOUD_INIT.version}`], {
      cwd: dl,
      timeoutMs: 300_000,
    }).catch(() => run('apt-get', ['-q', ...opts, 'download', 'cloud-init'], { cwd: dl, timeoutMs: 300_000 }));
    const debs = (await readdir(dl)).filter((f) => f.endsWith('.deb'));
    if (debs.length !== 1) throw new Error(`apt-get download left ${debs.length} .deb files in ${dl}`);
    const x = path.join(tmp, 'x');
    await run('dpkg-deb', ['-x', path.join(dl, debs[0]), x], { timeoutMs: 120_000 });
    await rename(path.join(x, 'usr', 'lib', 'python3', 'dist-packages'), path.join(tmp, 'python'));
    for (const d of [x, dl, state]) await rm(d, { recursive: true, force: true });
  });
  return path.join(dir, 'python');
}
