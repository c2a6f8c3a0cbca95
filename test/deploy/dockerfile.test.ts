import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { lintDockerfile, parseDockerfile, stagesOf } from '../support/dockerfile.ts';
import { runDockerfile, type ImageTree } from '../support/dockerfile-run.ts';
import { ROOT, findObject, loadYamlDocuments } from '../support/manifests.ts';
import { COMPILE_CACHE_DEBUG, transpileTrace } from '../support/compile-cache.ts';

const run = promisify(execFile);
const DOCKERFILE = join(ROOT, 'Dockerfile');
const text = readFileSync(DOCKERFILE, 'utf8');

// Inside the image `node` is the base image's Node 24 on PATH; here it is the
// Node running this test. System directories come after it (sh, readlink).
const nodeDir = dirname(process.execPath);
const hostPath = (tree: ImageTree) => [...tree.binDirs, nodeDir, '/usr/bin', '/bin'].join(':');

let tree: ImageTree;
let work: string;
// The ENTRYPOINT's compile-cache trace taken right after the build, before
// any other test starts the tree (each start through bin/vmseed fills the
// cache itself, which would hide a missing warm step).
let firstStart: { stderr: string };
before(async () => {
  work = mkdtempSync(join(tmpdir(), 'vmseed-image-'));
  tree = runDockerfile({
    dockerfile: DOCKERFILE,
    context: ROOT,
    out: join(work, 'rootfs'),
    // prefer-offline: use the npm cache when it has the locked tarball (a
    // cache policy, not a different install; the shared registry link here
    // can take minutes).
    env: {
      PATH: `${nodeDir}:/usr/bin:/bin`,
      HOME: process.env.HOME,
      npm_config_update_notifier: 'false',
      npm_config_prefer_offline: 'true',
    },
  });
  firstStart = await run(tree.entrypoint[0], [...tree.entrypoint.slice(1), '--help'], {
    cwd: '/',
    env: { PATH: hostPath(tree), ...COMPILE_CACHE_DEBUG },
  });
});
test.after(() => rmSync(work, { recursive: true, force: true }));

// The ENTRYPOINT is `tini -- <program>`: the program is what runs as vmseed.
const program = () => tree.entrypoint.slice(tree.entrypoint.indexOf('--') + 1);

async function vmseed(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const [cmd, ...rest] = [...program().slice(0, 1), ...args];
  return run(cmd, rest, { cwd: '/', env: { PATH: hostPath(tree) } }).then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => ({ code: e.code, stdout: e.stdout, stderr: e.stderr }),
  );
}

test('the Dockerfile passes the hadolint-style rules', () => {
  assert.deepEqual(lintDockerfile(text), []);
});

test('the linter catches each rule it claims', () => {
  const bad = [
    'FROM node AS deps',
    'FROM node:latest',
    'FROM node:24-slim',
    'WORKDIR app',
    'ADD . /app',
    'COPY --from=builder /x /y',
    'RUN apt-get install libvirt-clients',
    'RUN cd /tmp && sudo true && npm install',
    'RUN apt update',
    'USER root',
    'ENTRYPOINT vmseed agent',
  ].join('\n');
  const rules = new Set(lintDockerfile(bad).map((f) => f.rule));
  for (const rule of [
    'DL3006',
    'DL3007',
    'VS001',
    'DL3000',
    'DL3020',
    'DL3022',
    'DL3014',
    'DL3015',
    'DL3009',
    'DL3003',
    'DL3004',
    'VS002',
    'DL3027',
    'DL3002',
    'DL3025',
  ]) {
    assert.ok(rules.has(rule), `${rule} not reported`);
  }
  assert.ok(
    lintDockerfile('FROM node:24.21-bookworm-slim\nENTRYPOINT ["x"]').some((f) => f.rule === 'DL3002'),
    'no USER at all',
  );
});

test('the parser joins continuations and reads stages', () => {
  const stages = stagesOf(parseDockerfile(text));
  assert.equal(stages.length, 2);
  assert.equal(stages[0].name, 'deps');
  for (const s of stages) assert.match(s.image, /^node:24\.\d+-bookworm-slim$/, 'Node 24 slim, pinned to a minor');
  const apt = stages[1].instructions.find((i) => i.keyword === 'RUN' && i.args.includes('apt-get'))!;
  assert.match(apt.args, /^apt-get update && apt-get install .* && rm -rf \/var\/lib\/apt\/lists\/\*$/);
});

test('the image tree holds the runtime dependencies and none of the dev dependencies', () => {
  const app = join(tree.root, tree.workdir);
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    dependencies: object;
    devDependencies: object;
  };
  for (const dep of Object.keys(pkg.dependencies))
    assert.ok(existsSync(join(app, 'node_modules', dep, 'package.json')), `${dep} missing`);
  // Dev-only per the lockfile (a devDependency may also be a runtime
  // dependency of a dependency, e.g. @types/js-yaml of the Kubernetes client).
  const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8')) as {
    packages: Record<string, { dev?: boolean }>;
  };
  const devOnly = Object.keys(pkg.devDependencies).filter((d) => lock.packages[`node_modules/${d}`]?.dev === true);
  assert.ok(devOnly.includes('typescript') && devOnly.includes('node'));
  for (const dep of devOnly)
    assert.ok(!existsSync(join(app, 'node_modules', dep)), `dev dependency ${dep} in the image`);
  assert.ok(
    !existsSync(join(app, 'node_modules/.bin/node')),
    'no npm-installed node: the launcher must use the one on PATH',
  );
  assert.ok(existsSync(join(app, 'src/main.ts')) && existsSync(join(app, 'bin/vmseed')));
  assert.ok(!existsSync(join(app, 'test')) && !existsSync(join(app, 'manifests')), 'only what the Dockerfile copies');
});

test('virsh, tini, flock and nft come from the Debian packages the image adds, and they run', () => {
  assert.deepEqual(
    tree.aptPackages,
    ['libvirt-clients', 'tini', 'util-linux', 'nftables'],
    'nothing else in the final image',
  );
  assert.match(execFileSync('tini', ['--version'], { encoding: 'utf8' }), /^tini version \d/);
  assert.match(execFileSync('dpkg-query', ['-S', '/usr/bin/tini'], { encoding: 'utf8' }), /^tini:/);
  assert.match(execFileSync('dpkg-query', ['-S', '/usr/bin/flock'], { encoding: 'utf8' }), /^util-linux:/);
  assert.match(execFileSync('nft', ['--version'], { encoding: 'utf8' }), /^nftables v\d+\.\d+/);
  for (const p of tree.aptPackages) execFileSync('dpkg-query', ['-W', p]);
  const virsh = execFileSync('sh', ['-c', 'command -v virsh'], { encoding: 'utf8' }).trim();
  const owner = execFileSync(
    'dpkg-query',
    ['-S', execFileSync('readlink', ['-f', virsh], { encoding: 'utf8' }).trim()],
    { encoding: 'utf8' },
  );
  assert.match(owner, /^libvirt-clients:/);
  assert.match(execFileSync(virsh, ['--version'], { encoding: 'utf8' }), /^\d+\.\d+/);
});

test('the image user is the launcher qemu uid the DaemonSet runs as, and the entrypoint is vmseed agent', () => {
  assert.deepEqual(tree.entrypoint, ['tini', '--', 'vmseed', 'agent']);
  assert.equal(tree.user, '107:107');
  assert.deepEqual(
    tree.accounts.map((a) => `${a.kind}:${a.id}`),
    ['group:107', 'user:107'],
  );
  const ds = findObject(loadYamlDocuments('manifests/daemonset.yaml'), 'DaemonSet') as unknown as {
    spec: {
      template: {
        spec: {
          securityContext: { runAsUser: number; runAsGroup: number };
          containers: { name: string; command?: string[]; image: string; ports: { containerPort: number }[] }[];
        };
      };
    };
  };
  const pod = ds.spec.template.spec;
  assert.equal(`${pod.securityContext.runAsUser}:${pod.securityContext.runAsGroup}`, tree.user);
  const agent = pod.containers.find((c) => c.name === 'agent')!;
  assert.equal(agent.command, undefined, 'the DaemonSet relies on the ENTRYPOINT');
  assert.deepEqual(tree.exposed, [String(agent.ports[0].containerPort)]);
  const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
  assert.ok(agent.image.endsWith(`:${version}`), 'the manifest deploys the package version');
});

test('vmseed --help runs from the image tree on the Node found on PATH', async () => {
  const { code, stdout } = await vmseed(['--help']);
  assert.equal(code, 0);
  assert.match(stdout, /^usage: vmseed <command>/);
  // The launcher really used PATH: without a node there, it cannot start.
  const noNode = await run(program()[0], ['--help'], {
    cwd: '/',
    env: { PATH: [...tree.binDirs, '/bin'].join(':') },
  }).then(
    () => 0,
    (e: { code: number }) => e.code,
  );
  assert.notEqual(noNode, 0);
});

test('the ENTRYPOINT starts: tini -- vmseed agent --help', async () => {
  // Rejects on a non-zero exit.
  const { stdout } = await run(tree.entrypoint[0], [...tree.entrypoint.slice(1), '--help'], {
    cwd: '/',
    env: { PATH: hostPath(tree) },
  });
  assert.match(stdout, /--node-name/);
  // The flags the DaemonSet passes for KubeVirt are the agent's.
  for (const flag of ['--publish-dir', '--resume-via', '--image-path-in-domain', '--libvirt-uri'])
    assert.ok(stdout.includes(flag), flag);
});

// The DaemonSet sets no `command`, so the pod runs the ENTRYPOINT: the
// image's `vmseed` must be bin/vmseed, which starts Node with the small
// young generation and the malloc settings (MALLOC_ARENA_MAX=2, a fixed
// MALLOC_MMAP_THRESHOLD_) the memory limit was sized with.
// A `node` shim first on PATH records how the launcher really starts Node.
test('the ENTRYPOINT is bin/vmseed: Node started with --max-semi-space-size=1, MALLOC_ARENA_MAX=2 and MALLOC_MMAP_THRESHOLD_=131072', async () => {
  const link = execFileSync('readlink', ['-f', join(tree.binDirs[0], program()[0])], { encoding: 'utf8' }).trim();
  assert.equal(link, join(tree.root, tree.workdir, 'bin/vmseed'));
  const shimDir = mkdtempSync(join(tmpdir(), 'vmseed-node-shim-'));
  try {
    const log = join(shimDir, 'log');
    writeFileSync(
      join(shimDir, 'node'),
      `#!/bin/sh
printf 'MALLOC_ARENA_MAX=%s\n' "$MALLOC_ARENA_MAX" > ${log}
printf 'MALLOC_MMAP_THRESHOLD_=%s\n' "$MALLOC_MMAP_THRESHOLD_" >> ${log}
printf '%s\n' "$@" >> ${log}
exec ${process.execPath} "$@"
`,
      { mode: 0o755 },
    );
    const r = await run(tree.entrypoint[0], [...tree.entrypoint.slice(1), '--help'], {
      cwd: '/',
      env: { PATH: [...tree.binDirs, shimDir, '/usr/bin', '/bin'].join(':') },
    });
    assert.match(r.stdout, /usage: vmseed agent/);
    const [arena, mmap, ...argv] = readFileSync(log, 'utf8').trim().split('\n');
    assert.equal(arena, 'MALLOC_ARENA_MAX=2');
    assert.equal(mmap, 'MALLOC_MMAP_THRESHOLD_=131072');
    assert.deepEqual(argv, [
      '--max-semi-space-size=1',
      join(tree.root, tree.workdir, 'src/main.ts'),
      'agent',
      '--help',
    ]);
  } finally {
    rmSync(shimDir, { recursive: true, force: true });
  }
});

// The image build fills Node's compile cache (RUN vmseed warm-cache), so
// the pod starts without Node's TypeScript stripper. Here every step ran as
// the host user, who is also the one starting the tree (Node keys the cache
// by uid).
test('the image ships a warm compile cache: the ENTRYPOINT strips no TypeScript', () => {
  const app = join(tree.root, tree.workdir);
  assert.ok(existsSync(join(app, 'node_modules/.cache/vmseed')), 'the cache is in the image');
  const trace = transpileTrace(firstStart.stderr);
  assert.deepEqual(trace.misses, []);
  assert.ok(
    trace.hits.some((m) => m === `file://${join(app, 'src/commands/agent.ts')}`),
    'the agent command came from the cache',
  );
});

test('vmseed build from the image tree writes a NoCloud seed image', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-image-build-'));
  try {
    writeFileSync(join(dir, 'user-data'), '#cloud-config\nruncmd:\n  - echo hello\n');
    writeFileSync(join(dir, 'meta-data'), 'instance-id: iid-image-test\n');
    const out = join(dir, 'seed.iso');
    const { code, stderr } = await vmseed([
      'build',
      '--user-data',
      join(dir, 'user-data'),
      '--meta-data',
      join(dir, 'meta-data'),
      '-o',
      out,
    ]);
    assert.equal(code, 0, stderr);
    const pvd = execFileSync('isoinfo', ['-d', '-i', out], { encoding: 'utf8' });
    assert.match(pvd, /Volume id:\s+cidata/i);
    const userData = execFileSync('isoinfo', ['-R', '-i', out, '-x', '/user-data'], { encoding: 'utf8' });
    assert.equal(userData, readFileSync(join(dir, 'user-data'), 'utf8'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('.dockerignore keeps the context small without hiding what the Dockerfile copies', () => {
  const ignored = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
  for (const must of ['node_modules', '.git', 'test', 'e2e']) assert.ok(ignored.includes(must), `${must} not ignored`);
  const copied = parseDockerfile(text)
    .filter((i) => i.keyword === 'COPY' && i.flags.from === undefined)
    .flatMap((i) => i.args.split(/\s+/).slice(0, -1));
  for (const src of copied) assert.ok(!ignored.includes(src.replace(/\/$/, '')), `${src} is copied but ignored`);
});

// The issue this guards against: the virsh timeout kills virsh's process
// group, whose members are then re-parented to PID 1, and only PID 1 can
// reap them. The image's ENTRYPOINT runs as PID 1 of a fresh PID namespace
// (unshare, as the container runtime would), with a fake virsh that leaves
// two children in its group and never answers; the same agent started
// without tini is the control, and keeps the zombies.
test(
  'PID 1: the ENTRYPOINT (tini) reaps what virsh timeouts leave behind; Node as PID 1 does not',
  { timeout: 120_000 },
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'vmseed-pid1-'));
    try {
      const manifests = join(dir, 'manifests');
      execFileSync('mkdir', ['-p', manifests]);
      writeFileSync(join(manifests, 'vm.yaml'), readFileSync(join(ROOT, 'examples/nocloud-inline.yaml')));
      const zombiesWith = async (init: string[], name: string): Promise<{ zombies: number[]; calls: number }> => {
        const calls = join(dir, `${name}.calls`);
        const virsh = join(dir, `${name}-virsh`);
        writeFileSync(virsh, `#!/bin/sh\necho $$ >> '${calls}'\nsleep 300 &\nsleep 300 &\nexec sleep 300\n`, {
          mode: 0o755,
        });
        const child = spawn(
          'unshare',
          [
            '--pid',
            '--fork',
            '--kill-child',
            '--',
            ...init,
            ...program(),
            '--local',
            manifests,
            '--state-dir',
            join(dir, `${name}-seeds`),
            '--listen',
            '127.0.0.1:0',
            '--libvirt',
            'virsh',
            '--virsh-path',
            virsh,
            '--virsh-timeout',
            '1s',
          ],
          { cwd: '/', env: { PATH: hostPath(tree) }, stdio: ['ignore', 'ignore', 'pipe'] },
        );
        let log = '';
        child.stderr.on('data', (d) => (log += d));
        const exited = new Promise((r) => child.on('exit', r));
        try {
          // Three calls: the first two were killed by the timeout.
          const deadline = Date.now() + 60_000;
          const callCount = () => (existsSync(calls) ? readFileSync(calls, 'utf8').trim().split('\n').length : 0);
          while (callCount() < 3) {
            if (Date.now() > deadline || child.exitCode !== null)
              assert.fail(`${name}: virsh was not called three times; log:\n${log.slice(-2000)}`);
            await new Promise((r) => setTimeout(r, 200));
          }
          // PID 1 of the namespace: unshare's only child.
          const pid1 = Number(readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, 'utf8').trim());
          const zombies = () =>
            readdirSync('/proc')
              .filter((p) => /^\d+$/.test(p))
              .filter((p) => {
                try {
                  const stat = readFileSync(`/proc/${p}/stat`, 'utf8');
                  const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
                  return state === 'Z' && Number(ppid) === pid1;
                } catch {
                  return false;
                }
              })
              .map(Number);
          // Reaping is immediate for a reaper; give it a moment all the same.
          let z = zombies();
          for (let i = 0; i < 20 && z.length > 0; i++) {
            await new Promise((r) => setTimeout(r, 100));
            z = zombies();
          }
          return { zombies: z, calls: callCount() };
        } finally {
          // unshare ignores SIGTERM while it waits; SIGKILL it, and --kill-child
          // takes PID 1, and with it the whole namespace.
          child.kill('SIGKILL');
          await exited;
        }
      };
      const control = await zombiesWith([], 'node');
      assert.ok(
        control.zombies.length >= 4,
        `Node as PID 1 keeps the killed children as zombies (${control.zombies.length} after ${control.calls} calls)`,
      );
      const image = await zombiesWith(tree.entrypoint.slice(0, tree.entrypoint.indexOf('--') + 1), 'tini');
      assert.deepEqual(image.zombies, [], `tini reaps them (${image.calls} calls)`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
