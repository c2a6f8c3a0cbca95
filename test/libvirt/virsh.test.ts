import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import {
  classifyVirshError,
  Virsh,
  NodeProcessSpawner,
  XML_FILE,
  type ProcessSpawner,
  type SpawnOptions,
  type SpawnResult,
} from '../../src/libvirt/virsh/runner.ts';
import { fstatSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { holdSocket, type HeldSocket } from '../../src/libvirt/rpc/socket-hold.ts';

// stderr exactly as virsh 9.0 printed it here (libvirt src/qemu/qemu_hotplug.c).
const REAL: Array<[string, string, boolean]> = [
  ["error: failed to get domain 'x'\n", 'DOMAIN_NOT_FOUND', true],
  [
    "error: Failed to attach device from /tmp/d.xml\nerror: XML error: target 'vdb' duplicated for disk sources '/a' and '/b'\n",
    'TARGET_IN_USE',
    true,
  ],
  [
    'error: Failed to attach device from /tmp/d.xml\nerror: Requested operation is not valid: target vdb already exists\n',
    'TARGET_IN_USE',
    true,
  ],
  [
    'error: Failed to attach device from /tmp/disk.xml\nerror: unsupported configuration: non unique alias detected: ua-vmseed\n',
    'ALIAS_IN_USE',
    true,
  ],
  [
    "error: Failed to attach device from /tmp/d.xml\nerror: Cannot access storage file '/nope/seed.iso': No such file or directory\n",
    'SEED_FILE_NOT_ACCESSIBLE',
    true,
  ],
  [
    'error: Failed to attach device from /tmp/d.xml\nerror: Requested operation is not valid: transient domains do not have any persistent config\n',
    'DOMAIN_TRANSIENT',
    false,
  ],
  [
    'error: Failed to detach device from /tmp/d.xml\nerror: device not found: disk vdz not found\n',
    'DEVICE_NOT_FOUND',
    true,
  ],
  ['error: internal error: no device found with alias ua-nope\n', 'DEVICE_NOT_FOUND', true],
  [
    "error: failed to connect to the hypervisor\nerror: Failed to connect socket to '/tmp/nope/libvirt-sock': No such file or directory\n",
    'LIBVIRT_UNREACHABLE',
    true,
  ],
  [
    'error: Failed to attach device from /dev/stdin\nerror: Requested operation is not valid: domain is not running\n',
    'VIRSH_FAILED',
    true,
  ],
  ["error: Failed to attach device from x\nerror: Bus 'pci.0' does not support hotplugging\n", 'VIRSH_FAILED', true],
];

for (const [stderr, code, retryable] of REAL) {
  test(`classify: ${stderr.trim().split('\n').pop()} → ${code}`, () => {
    const e = classifyVirshError(stderr, 'attach-device');
    assert.equal(e.code, code);
    assert.equal(e.retryable, retryable);
    assert.match(e.message, /^virsh attach-device/);
  });
}

class FakeSpawner implements ProcessSpawner {
  calls: Array<{ file: string; args: string[]; options: SpawnOptions; fileContent?: string }> = [];
  result: Partial<SpawnResult>;
  constructor(result: Partial<SpawnResult>) {
    this.result = result;
  }
  holdSocket(socketPath: string): HeldSocket {
    return holdSocket(socketPath);
  }
  async run(file: string, args: readonly string[], options: SpawnOptions): Promise<SpawnResult> {
    const xmlArg = args.find((a) => a.endsWith('device.xml'));
    this.calls.push({ file, args: [...args], options, fileContent: xmlArg ? readFileSync(xmlArg, 'utf8') : undefined });
    return {
      exitCode: 0,
      signal: null,
      stdout: '',
      stderr: '',
      timedOut: false,
      outputTruncated: false,
      ...this.result,
    };
  }
}

const opts = { virshPath: '/usr/bin/virsh', uri: 'qemu:///system', timeoutMs: 1000, maxOutputBytes: 1 << 20 };

test('Virsh passes the URI, quiet mode, C locale and limits; no shell', async () => {
  const f = new FakeSpawner({ stdout: 'out' });
  const v = new Virsh({ ...opts, spawner: f });
  assert.equal(await v.run(['dominfo', "a b;'c"]), 'out');
  assert.deepEqual(f.calls[0].args, ['-q', '-c', 'qemu:///system', 'dominfo', "a b;'c"]);
  assert.equal(f.calls[0].file, '/usr/bin/virsh');
  assert.equal(f.calls[0].options.timeoutMs, 1000);
  assert.equal(f.calls[0].options.env?.LC_ALL, 'C');
});

test('XML_FILE becomes a private temporary file that is removed afterwards', async () => {
  const f = new FakeSpawner({});
  await new Virsh({ ...opts, spawner: f }).run(['attach-device', 'd', XML_FILE, '--live'], { xml: '<disk/>' });
  const path = f.calls[0].args[5];
  assert.equal(f.calls[0].fileContent, '<disk/>');
  assert.throws(() => readFileSync(path), { code: 'ENOENT' }, 'the temporary XML file is gone');
});

test('timeout, missing binary, output overflow and failures are typed', async () => {
  const cases: Array<[Partial<SpawnResult>, string]> = [
    [{ timedOut: true, exitCode: null, signal: 'SIGKILL' }, 'VIRSH_TIMEOUT'],
    [{ spawnError: 'not-found' }, 'VIRSH_NOT_FOUND'],
    [{ outputTruncated: true }, 'VIRSH_FAILED'],
    [{ exitCode: 1, stderr: "error: failed to get domain 'x'\n" }, 'DOMAIN_NOT_FOUND'],
    [{ exitCode: 1, stderr: '' }, 'VIRSH_FAILED'],
  ];
  for (const [r, code] of cases) {
    await assert.rejects(
      new Virsh({ ...opts, spawner: new FakeSpawner(r) }).run(['dominfo', 'x']),
      (e: unknown) => (e as { code: string }).code === code,
    );
  }
});

test("a URI's socket= path: virsh gets the socket's inode as descriptor 3, never the name; a symlink is refused, a missing socket retried", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-virsh-dial-'));
  const sock = join(dir, 'virtqemud sock');
  const server = createServer();
  await new Promise<void>((r) => server.listen(sock, r));
  t.after(() => {
    server.close();
    rmSync(dir, { recursive: true, force: true });
  });
  symlinkSync(sock, join(dir, 'link'));
  const uri = (path: string) => `qemu+unix:///session?no_tty=1&socket=${encodeURIComponent(path)}`;
  const inode = statSync(sock).ino;
  let seen: number | undefined;
  const f = new FakeSpawner({
    exitCode: 1,
    stderr: "error: Failed to connect socket to '/proc/self/fd/3': Connection refused\n",
  });
  const run = f.run.bind(f);
  f.run = (file, args, o) => {
    // The descriptor is open while virsh runs, and is the socket's.
    seen = fstatSync(o.fds![0]).ino;
    return run(file, args, o);
  };
  const e = await new Virsh({ ...opts, uri: uri(sock), spawner: f }).run(['version']).then(
    () => assert.fail('virsh failed'),
    (err: Error & { code: string }) => err,
  );
  assert.deepEqual(f.calls[0].args.slice(0, 3), ['-q', '-c', 'qemu+unix:///session?no_tty=1&socket=/proc/self/fd/3']);
  assert.equal(f.calls[0].options.fds?.length, 1);
  assert.equal(seen, inode);
  assert.throws(() => fstatSync(f.calls[0].options.fds![0]), /EBADF/, 'closed after the call');
  assert.equal(e.code, 'LIBVIRT_UNREACHABLE');
  assert.ok(e.message.includes(`Failed to connect socket to '${sock}'`), `the configured path is named: ${e.message}`);

  const refused = (path: string) =>
    new Virsh({ ...opts, uri: uri(path), spawner: f }).run(['version']).then(
      () => assert.fail(`${path} dialled`),
      (err: Error & { code: string }) => err.code,
    );
  const before = f.calls.length;
  assert.equal(await refused(join(dir, 'link')), 'LIBVIRT_ACCESS_DENIED');
  assert.equal(await refused(join(dir, 'missing')), 'LIBVIRT_UNREACHABLE');
  assert.equal(f.calls.length, before, 'no virsh started');
});

function alive(pattern: string): boolean {
  try {
    execFileSync('pgrep', ['-f', pattern]);
    return true;
  } catch {
    return false;
  }
}

test('NodeProcessSpawner: the timeout kills the whole process group', async () => {
  const marker = String(800_000 + Math.floor(Math.random() * 90_000));
  const r = await new NodeProcessSpawner().run('/bin/sh', ['-c', `sleep ${marker}; echo done`], {
    timeoutMs: 300,
    maxOutputBytes: 1000,
  });
  assert.equal(r.timedOut, true);
  assert.equal(r.stdout, '');
  await new Promise((res) => setTimeout(res, 100));
  assert.equal(alive(`sleep ${marker}`), false);
});

test('NodeProcessSpawner: output is bounded and the writer killed', async () => {
  const r = await new NodeProcessSpawner().run('/usr/bin/yes', [], { timeoutMs: 10_000, maxOutputBytes: 64 * 1024 });
  assert.equal(r.outputTruncated, true);
  assert.ok(r.stdout.length + r.stderr.length <= 64 * 1024);
});

test('NodeProcessSpawner: exit code, stdout, stderr; missing binary', async () => {
  const r = await new NodeProcessSpawner().run('/bin/sh', ['-c', 'echo out; echo err >&2; exit 3'], {
    timeoutMs: 5000,
    maxOutputBytes: 1000,
  });
  assert.deepEqual([r.exitCode, r.stdout, r.stderr, r.timedOut], [3, 'out\n', 'err\n', false]);
  const m = await new NodeProcessSpawner().run('/nonexistent/virsh', [], { timeoutMs: 5000, maxOutputBytes: 1000 });
  assert.equal(m.spawnError, 'not-found');
});
