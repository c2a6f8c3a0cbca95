// SIGTERM ends the real agent process within its deadline even when work
// hangs: a virsh that never returns is killed at the deadline (the agent's
// cancel signal) and the process exits on its own, virsh gone; a libvirt
// RPC call that never returns is cancelled the same way. A FIFO among
// the manifests no longer hangs a read at all (refused, non-blocking open).
// Also the exit plan for what still holds the loop after the deadline (a
// thread-pool read blocked in open(2), which process.exit() alone would
// wait for forever).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { chmod, copyFile, mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { tempDir, waitFor } from '../support/agent-harness.ts';
import { planExit, forceExit } from '../../src/commands/process-exit.ts';
import { RemoteProc } from '../../src/libvirt/rpc/protocol.ts';
import { handshakeDaemon } from '../support/fake-rpc-daemon.ts';

const ROOT = new URL('../../', import.meta.url).pathname;
// Far beyond anything the agent would wait on its own: exiting well before
// it proves the stop deadline, not the hung call, ended the process.
const HANG = '600';

interface Run {
  pid: number;
  log: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

function startAgent(args: string[], cwd: string): Run {
  const child = spawn(
    process.execPath,
    [join(ROOT, 'src/main.ts'), 'agent', ...args, '--listen', '127.0.0.1:0', '--shutdown-timeout', '1s'],
    {
      cwd,
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  return {
    pid: child.pid!,
    log: () => out,
    exited: new Promise((r) => child.on('exit', (code, signal) => r({ code, signal }))),
  };
}

// The exit must come from the agent: a generous bound, SIGKILL past it.
async function sigtermAndWait(
  run: Run,
  boundMs = 30_000,
): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  process.kill(run.pid, 'SIGTERM');
  let timer: NodeJS.Timeout | undefined;
  const r = await Promise.race([
    run.exited,
    new Promise<'hung'>((res) => (timer = setTimeout(() => res('hung'), boundMs))),
  ]);
  clearTimeout(timer);
  if (r === 'hung') {
    process.kill(run.pid, 'SIGKILL');
    assert.fail(`the agent did not exit within ${boundMs} ms of SIGTERM; log:\n${run.log().slice(-2000)}`);
  }
  return r;
}

const records = (log: string) =>
  log
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

test(
  'SIGTERM with a virsh call that never returns: at the deadline virsh is killed, the reconcile cancelled, and the agent exits saying why',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-stop-virsh-');
    const pidFile = join(dir.path, 'virsh.pid');
    t.after(async () => {
      // The hung fake virsh (our own child's child, by the PID it wrote).
      if (existsSync(pidFile))
        for (const p of readFileSync(pidFile, 'utf8').split('\n').filter(Boolean))
          try {
            process.kill(Number(p), 'SIGKILL');
          } catch {
            /* gone */
          }
      await dir.remove();
    });
    const virsh = join(dir.path, 'virsh');
    await writeFile(virsh, `#!/bin/sh\necho $$ >> '${pidFile}'\nexec sleep ${HANG}\n`);
    await chmod(virsh, 0o755);
    const manifests = join(dir.path, 'manifests');
    await mkdir(manifests);
    await copyFile(join(ROOT, 'examples/nocloud-inline.yaml'), join(manifests, 'vm.yaml'));
    const run = startAgent(
      [
        '--local',
        manifests,
        '--state-dir',
        join(dir.path, 'seeds'),
        '--libvirt',
        'virsh',
        '--virsh-path',
        virsh,
        '--virsh-timeout',
        `${HANG}s`,
      ],
      dir.path,
    );
    await waitFor('virsh called', () => existsSync(pidFile), 60_000);
    const virshPids = readFileSync(pidFile, 'utf8').split('\n').filter(Boolean).map(Number);
    const { code, signal } = await sigtermAndWait(run);
    assert.equal(signal, null, run.log().slice(-2000));
    assert.equal(code, 1, 'cancelled work is not a clean stop');
    const log = records(run.log());
    const cancelled = log.find((r) => r.msg === 'reconciles in flight at the stop deadline were cancelled');
    assert.ok(cancelled, run.log().slice(-2000));
    assert.ok((cancelled.inFlight as number) >= 1);
    const stopped = log.find((r) => r.msg === 'vmseed agent stopped; cancelled work runs again at the next start');
    assert.ok(stopped, run.log().slice(-2000));
    assert.equal(stopped.reason, 'reconciles still in flight at the stop deadline were cancelled');
    // The reconcile ended as cancelled, not as a failure of the VMI.
    assert.ok(
      log.some((r) => r.code === 'CANCELLED'),
      run.log().slice(-2000),
    );
    assert.ok(
      !log.some((r) => r.msg === 'vmseed agent stopped with work abandoned; exiting anyway'),
      run.log().slice(-2000),
    );
    // Nothing held the loop any more: main() did not have to end the process.
    assert.ok(!log.some((r) => r.msg === 'exiting with work still pending'), run.log().slice(-2000));
    for (const pid of virshPids) assert.equal(alive(pid), false, `fake virsh ${pid} was killed`);
  },
);

test(
  'SIGTERM with a libvirt RPC call that never returns (--libvirt rpc): at the deadline the call is cancelled and the agent exits on its own',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-stop-rpc-');
    // Answers the handshake and event registration, then nothing: a hung
    // libvirtd.
    let asked = false;
    const daemon = await handshakeDaemon([0], (p) => {
      if (p.header.proc !== RemoteProc.DOMAIN_LOOKUP_BY_NAME) return false;
      asked = true;
      return true;
    });
    t.after(async () => {
      await daemon.close();
      await dir.remove();
    });
    const manifests = join(dir.path, 'manifests');
    await mkdir(manifests);
    await copyFile(join(ROOT, 'examples/nocloud-inline.yaml'), join(manifests, 'vm.yaml'));
    const run = startAgent(
      [
        '--local',
        manifests,
        '--state-dir',
        join(dir.path, 'seeds'),
        '--libvirt',
        'rpc',
        '--libvirt-uri',
        `qemu+unix:///session?socket=${daemon.path}`,
        '--virsh-timeout',
        `${HANG}s`,
      ],
      dir.path,
    );
    await waitFor('the domain asked for', () => asked, 60_000);
    const { code, signal } = await sigtermAndWait(run);
    assert.equal(signal, null, run.log().slice(-2000));
    assert.equal(code, 1, 'cancelled work is not a clean stop');
    const log = records(run.log());
    assert.ok(
      log.some((r) => r.msg === 'reconciles in flight at the stop deadline were cancelled'),
      run.log().slice(-2000),
    );
    assert.ok(
      log.some((r) => r.code === 'CANCELLED'),
      run.log().slice(-2000),
    );
    assert.ok(
      !log.some((r) => r.msg === 'vmseed agent stopped with work abandoned; exiting anyway'),
      run.log().slice(-2000),
    );
    // Nothing held the loop any more (the connection's timers went with it).
    assert.ok(!log.some((r) => r.msg === 'exiting with work still pending'), run.log().slice(-2000));
  },
);

test(
  'a FIFO among the manifests: refused without blocking, the other VMI seeded, SIGTERM a clean stop',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-stop-fifo-');
    t.after(() => dir.remove());
    const manifests = join(dir.path, 'manifests');
    await mkdir(manifests);
    await copyFile(join(ROOT, 'examples/nocloud-inline.yaml'), join(manifests, 'vm.yaml'));
    // A blocking open of it would wait for a writer: none will come.
    execFileSync('mkfifo', [join(manifests, 'zz-fifo.yaml')]);
    const run = startAgent(['--local', manifests, '--state-dir', join(dir.path, 'seeds')], dir.path);
    await waitFor('the seed written', () => records(run.log()).some((r) => r.msg === 'seed ready'), 60_000);
    const refused = records(run.log()).find((r) => r.file === 'zz-fifo.yaml');
    assert.equal(refused?.code, 'MANIFEST_INVALID', run.log().slice(-2000));
    assert.equal(blockedInFifoOpen(run.pid), false, "no thread waits in the FIFO's open");
    const { code, signal } = await sigtermAndWait(run);
    assert.equal(signal, null, run.log().slice(-2000));
    assert.equal(code, 0, run.log().slice(-2000));
    assert.ok(
      records(run.log()).some((r) => r.msg === 'vmseed agent stopped' && r.finished === true),
      run.log().slice(-2000),
    );
  },
);

function blockedInFifoOpen(pid: number): boolean {
  try {
    return readdirSync(`/proc/${pid}/task`).some((t) => {
      try {
        return readFileSync(`/proc/${pid}/task/${t}/wchan`, 'utf8') === 'wait_for_partner';
      } catch {
        return false;
      }
    });
  } catch {
    return false;
  }
}

test('planExit: a stuck file-system request needs the signal; anything else exits with the code', () => {
  assert.deepEqual(planExit(0, ['PipeWrap', 'PipeWrap', 'TTYWrap', 'Timeout']), { how: 'exit', code: 0, pending: [] });
  assert.deepEqual(planExit(1, ['PipeWrap', 'ProcessWrap', 'TCPServerWrap']), {
    how: 'exit',
    code: 1,
    pending: ['ProcessWrap', 'TCPServerWrap'],
  });
  assert.deepEqual(planExit(1, ['FSReqPromise', 'Timeout']), { how: 'signal', pending: ['FSReqPromise'] });
  assert.equal(planExit(0, ['FSReqCallback']).how, 'signal');
  assert.equal(planExit(0, ['FSEventWrap']).how, 'exit', 'a watcher is not a stuck request');
  const calls: string[] = [];
  const lines: string[] = [];
  forceExit(3, 'test', {
    activeResources: () => ['ProcessWrap', 'ProcessWrap'],
    log: (l) => lines.push(l),
    exit: (c) => calls.push(`exit ${c}`),
    terminate: () => calls.push('terminate'),
  });
  forceExit(3, 'test', {
    activeResources: () => ['FSReqPromise'],
    log: (l) => lines.push(l),
    exit: (c) => calls.push(`exit ${c}`),
    terminate: () => calls.push('terminate'),
  });
  assert.deepEqual(calls, ['exit 3', 'terminate']);
  assert.deepEqual(JSON.parse(lines[0]).pending, { ProcessWrap: 2 });
  assert.equal(JSON.parse(lines[0]).reason, 'test');
});
