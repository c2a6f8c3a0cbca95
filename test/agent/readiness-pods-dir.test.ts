// /readyz's libvirt check in KubeVirt mode, evaluated as the DaemonSet runs
// (user, groups and capabilities from manifests/daemonset.yaml, applied with
// setpriv) on a pods directory with the kubelet's mode 0750 root:root, and
// with the URI the manifest's own arguments give: ready as shipped; not
// ready, naming supplementalGroups, without group 0; not ready when the
// directory is not mounted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmod, mkdir, rm } from 'node:fs/promises';
import { promisify } from 'node:util';
import { loadConfig } from '../../src/config/config.ts';
import { readDaemonSetAgent, setprivOptions, withOverrides } from '../../e2e/support/daemonset-agent.ts';

const run = promisify(execFile);
const CHECKS = new URL('../../src/commands/agent/readiness-checks.ts', import.meta.url).pathname;

// mkdtemp's six random characters make the socket path too long.
async function shortDir(): Promise<string> {
  for (;;) {
    const p = `/vp${Math.random().toString(36).slice(2, 5)}`;
    try {
      await mkdir(p, { mode: 0o750 });
      return p;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
  }
}

async function checkAs(setpriv: string[], uri: string): Promise<string> {
  const script = `import { libvirtSocketCheck } from ${JSON.stringify(CHECKS)};
    const c = libvirtSocketCheck(${JSON.stringify(uri)});
    console.log(JSON.stringify(c ? (await c()) ?? 'ready' : 'no check'));`;
  const { stdout } = await run('setpriv', [...setpriv, process.execPath, '--input-type=module', '-e', script], {
    timeout: 60_000,
  });
  return JSON.parse(stdout) as string;
}

test(
  "KubeVirt mode as shipped: ready through the kubelet's 0750 root:root pods directory with group 0; without it the reason names supplementalGroups",
  { timeout: 120_000 },
  async (t) => {
    assert.equal(process.getuid?.(), 0, "building the kubelet's owners needs root (the test environment runs as root)");
    // A short path like the manifest's /pods: a launcher socket path under
    // it must fit in sun_path (the config refuses longer ones).
    const pods = await shortDir();
    t.after(() => rm(pods, { recursive: true, force: true }));
    await chmod(pods, 0o750);

    const ds = readDaemonSetAgent();
    const config = loadConfig(
      withOverrides(['agent', ...ds.args], { 'pods-dir': pods, 'node-name': 'node-a' }).slice(1),
      { NODE_NAME: 'node-a' },
      '/',
    )!;
    assert.equal(config.libvirt.platform, 'kubevirt');
    assert.match(config.libvirt.uri, /\{podUID\}/);

    const shipped = setprivOptions(ds);
    assert.ok(shipped.includes('--groups=0'), `the manifest gives group 0: ${shipped.join(' ')}`);
    assert.equal(await checkAs(shipped, config.libvirt.uri), 'ready');

    const withoutGroup0 = shipped.map((o) => (o.startsWith('--groups=') ? '--clear-groups' : o));
    const reason = await checkAs(withoutGroup0, config.libvirt.uri);
    assert.match(reason, new RegExp(`cannot enter ${pods}, .*EACCES.*supplementalGroups: \\[0\\]`));

    await rm(pods, { recursive: true });
    assert.match(
      await checkAs(shipped, config.libvirt.uri),
      new RegExp(`${pods}, .* does not exist; mount the kubelet's pods directory there \\(--pods-dir\\)`),
    );
  },
);
