// `--libvirt rpc` is what the DaemonSet ships and the default wherever the
// URI is a local socket, but the mode-switchable libvirt e2e files
// (e2e/support/libvirt-mode.ts) run on their default, virsh, in the suite's
// own pass. This runs them again with VMSEED_E2E_LIBVIRT=rpc, in a child
// test runner, so both clients pass the same tests on every run. The
// DaemonSet replicas of kubevirt-node* need no second pass: they take
// `--libvirt=rpc` from the manifest's own arguments.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const FILES = [
  'e2e/libvirt-inject.test.ts',
  'e2e/libvirt-timeout.test.ts',
  'e2e/content-path.test.ts',
  'e2e/kubevirt-disk.test.ts',
  'e2e/libvirt-guest.test.ts',
  'e2e/agent-libvirt-busybox.test.ts',
];
const ROOT = fileURLToPath(new URL('..', import.meta.url));

// One child run, and one test with its own timeout, per file: a hang or a
// slow boot fails that file alone and fast, not one test holding every boot.
for (const file of FILES) {
  test(`${file} passes on the RPC client (VMSEED_E2E_LIBVIRT=rpc)`, { timeout: 480_000 }, async (t) => {
    const child = spawn(process.execPath, ['--test', '--test-reporter=tap', '--test-timeout=240000', file], {
      cwd: ROOT,
      // Without NODE_TEST_CONTEXT (set for the files a test runner starts),
      // or the child would take itself for one and run nothing.
      env: {
        ...Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== 'NODE_TEST_CONTEXT')),
        VMSEED_E2E_LIBVIRT: 'rpc',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
      // A timed-out test ends its child run, whose own hooks clean up.
      signal: t.signal,
      killSignal: 'SIGTERM',
    });
    child.on('error', () => {});
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    const count = (what: string) => Number(new RegExp(`^# ${what} (\\d+)$`, 'm').exec(out)?.[1] ?? NaN);
    t.diagnostic(`rpc client: ${count('pass')} of ${count('tests')} passed`);
    const failed = out.split('\n').filter((l) => /^\s*not ok /.test(l));
    assert.equal(
      code,
      0,
      `VMSEED_E2E_LIBVIRT=rpc node --test ${file} exited ${code}; failing:\n${failed.join('\n')}\n${out.slice(-6000)}`,
    );
    // A run that found no tests would also exit 0, and so would one whose
    // tests skipped (a missing tool) or were cancelled.
    const declared = (readFileSync(join(ROOT, file), 'utf8').match(/^\s*test\(/gm) ?? []).length;
    assert.ok(count('tests') >= declared && count('fail') === 0, `expected ${declared} tests: ${out.slice(-2000)}`);
    for (const what of ['skipped', 'todo', 'cancelled'])
      assert.equal(count(what), 0, `${what} on the RPC client: ${out.slice(-2000)}`);
  });
}
