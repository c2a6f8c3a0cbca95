// The publisher as the DaemonSet runs it (uid 107, gid 107, supplementary
// group 0, no capabilities, via setpriv) on a kubelet pods tree with the
// kubelet's modes: pods/<uid>/volumes 0750 root:root, the emptyDir parent
// 0755, the launcher's ephemeral-disks emptyDir 2777 root:107. It must get
// through, create vmseed/, write a copy QEMU (uid 107) can read, and prune it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmod, chown, mkdir, mkdtemp, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const POD = '0b4c2c4e-6f0e-4a4e-9d55-1f1f0c6e1a01';
const NODE_BIN = process.execPath;
const PUBLISH = new URL('../../src/libvirt/publish.ts', import.meta.url).pathname;

function asQemu(groups: string, script: string) {
  return run(
    'setpriv',
    [
      '--reuid=107',
      '--regid=107',
      `--groups=${groups}`,
      '--inh-caps=-all',
      '--bounding-set=-all',
      NODE_BIN,
      '--input-type=module',
      '-e',
      script,
    ],
    { timeout: 60_000 },
  );
}

test(
  "as uid 107 with group 0 and no capabilities: through the 0750 root dirs, vmseed/ created, the copy readable by QEMU's uid, pruned",
  { timeout: 120_000 },
  async (t) => {
    assert.equal(
      process.getuid?.(),
      0,
      "building a tree with the kubelet's owners needs root (the test environment runs as root)",
    );
    const root = await mkdtemp(join(tmpdir(), 'vmseed-kubelet-'));
    t.after(() => rm(root, { recursive: true, force: true }));
    await chmod(root, 0o755);
    const pods = join(root, 'pods');
    const ephemeral = join(pods, POD, 'volumes', 'kubernetes.io~empty-dir', 'ephemeral-disks');
    await mkdir(ephemeral, { recursive: true });
    for (const d of [pods, join(pods, POD), join(pods, POD, 'volumes')]) await chmod(d, 0o750);
    await chmod(join(pods, POD, 'volumes', 'kubernetes.io~empty-dir'), 0o755);
    await chown(ephemeral, 0, 107);
    await chmod(ephemeral, 0o2777);
    const store = join(root, 'store');
    await mkdir(store, { mode: 0o755 });
    await chmod(store, 0o755);
    const image = join(store, 'nocloud-0123456789abcdef.iso');
    await writeFile(image, 'seed bytes', { mode: 0o644 });

    const script = (op: string) => `
    import { DirPublisher } from ${JSON.stringify(PUBLISH)};
    const p = new DirPublisher({ dirTemplate: ${JSON.stringify(join(pods, '{podUID}/volumes/kubernetes.io~empty-dir/ephemeral-disks'))}, subdir: 'vmseed' });
    const t = { namespace: 'n', name: 'v', uid: 'u', datasource: 'nocloud', annotations: {}, launcherPods: [${JSON.stringify(POD)}] };
    ${op}`;
    // Without group 0 the kubelet's 0750 root:root directories stop it.
    await assert.rejects(
      asQemu('107', script(`await p.publish(t, ${JSON.stringify(image)});`)),
      (e: { stderr?: string }) => /EACCES/.test(e.stderr ?? ''),
    );
    assert.deepEqual(await readdir(ephemeral), []);

    const { stdout } = await asQemu('0', script(`console.log(await p.publish(t, ${JSON.stringify(image)}));`));
    const copy = join(ephemeral, 'vmseed', 'vmseed-nocloud-0123456789abcdef.iso');
    assert.equal(stdout.trim(), copy);
    const dir = await stat(join(ephemeral, 'vmseed'));
    assert.deepEqual([dir.uid, dir.gid, dir.mode & 0o7777], [107, 107, 0o2750]);
    const file = await stat(copy);
    assert.deepEqual([file.uid, file.gid, file.mode & 0o777], [107, 107, 0o640]);
    // QEMU in a non-root launcher (uid 107, group 107, no group 0) sees the
    // emptyDir mounted at /var/run/kubevirt-ephemeral-disks: a bind mount in a
    // mount namespace of its own stands for the pod.
    const mnt = join(root, 'launcher-view');
    await mkdir(mnt, { mode: 0o755 });
    const { stdout: read } = await run(
      'unshare',
      [
        '-m',
        '--propagation',
        'private',
        'sh',
        '-c',
        'mount --bind "$1" "$2" && exec setpriv --reuid=107 --regid=107 --groups=107 --inh-caps=-all cat "$2/vmseed/vmseed-nocloud-0123456789abcdef.iso"',
        'sh',
        ephemeral,
        mnt,
      ],
      { timeout: 30_000 },
    );
    assert.equal(read, 'seed bytes');

    await asQemu('0', script(`await p.prune(t, 'other');`));
    assert.deepEqual(await readdir(join(ephemeral, 'vmseed')), []);
  },
);
