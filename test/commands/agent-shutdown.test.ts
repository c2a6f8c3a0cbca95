// SIGTERM ends the real agent process within its deadline even when work
// hangs: a virsh that never returns (a ProcessWrap holds the loop) and a
// FIFO among the manifests (a thread-pool read blocked in open(2), which
// process.exit() alone would wait for forever). Also the exit plan itself.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { chmod, copyFile, mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { tempDir, waitFor } from '../support/agent-harness.ts';
import { planExit, forceExit } from '../../src/process-exit.ts';

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
  const child = spawn(process.execPath, [join(ROOT, 'src/main.ts'), 'agent', ...args, '--listen', '127.0.0.1:0', '--shutdown-timeout', '1s'], {
    cwd,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
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
async function sigtermAndWait(run: Run, boundMs = 30_000): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  process.kill(run.pid, 'SIGTERM');
  let timer: NodeJS.Timeout | undefined;
  const r = await Promise.race([run.exited, new Promise<'hung'>((res) => (timer = setTimeout(() => res('hung'), boundMs)))]);
  clearTimeout(timer);
  if (r === 'hung') {
    process.kill(run.pid, 'SIGKILL');
    assert.fail(`the agent did not exit within ${boundMs} ms of SIGTERM; log:\n${run.log().slice(-2000)}`);
  }
  return r;
}

const records = (log: string) => log.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);

test('SIGTERM with a virsh call that never returns: the agent exits after the deadline and says why', { timeout: 60_000 }, async (t) => {
  const dir = await tempDir('vmseed-stop-virsh-');
  const pidFile = join(dir.path, 'virsh.pid');
  t.after(async () => {
    // The hung fake virsh (our own child's child, by the PID it wrote).
    if (existsSync(pidFile)) for (const p of readFileSync(pidFile, 'utf8').split('\n').filter(Boolean)) try { process.kill(Number(p), 'SIGKILL'); } catch { /* gone */ }
    await dir.remove();
  });
  const virsh = join(dir.path, 'virsh');
  await writeFile(virsh, `#!/bin/sh\necho $$ >> '${pidFile}'\nexec sleep ${HANG}\n`);
  await chmod(virsh, 0o755);
  const manifests = join(dir.path, 'manifests');
  await mkdir(manifests);
  await copyFile(join(ROOT, 'examples/nocloud-inline.yaml'), join(manifests, 'vm.yaml'));
  const run = startAgent(['--local', manifests, '--state-dir', join(dir.path, 'seeds'), '--libvirt', 'virsh', '--virsh-path', virsh, '--virsh-timeout', `${HANG}s`], dir.path);
  await waitFor('virsh called', () => existsSync(pidFile), 20_000);
  const { code, signal } = await sigtermAndWait(run);
  assert.equal(signal, null, run.log().slice(-2000));
  assert.equal(code, 1, 'abandoned work is not a clean stop');
  const log = records(run.log());
  const stopped = log.find((r) => r.msg === 'vmseed agent stopped with work abandoned; exiting anyway');
  assert.ok(stopped, run.log().slice(-2000));
  assert.equal(stopped.reason, 'reconciles still in flight at the stop deadline');
  assert.ok((stopped.inFlight as number) >= 1);
  // The virsh child still held the loop: main() ended the process itself.
  const exit = log.find((r) => r.msg === 'exiting with work still pending');
  assert.ok(exit, run.log().slice(-2000));
  assert.equal(exit.exit, 1);
  assert.ok((exit.pending as Record<string, number>).ProcessWrap! >= 1, JSON.stringify(exit.pending));
});

test('SIGTERM with a read blocked on a FIFO: the agent exits (SIGTERM default action) and says why', { timeout: 60_000 }, async (t) => {
  const dir = await tempDir('vmseed-stop-fifo-');
  t.after(() => dir.remove());
  const manifests = join(dir.path, 'manifests');
  await mkdir(manifests);
  await copyFile(join(ROOT, 'examples/nocloud-inline.yaml'), join(manifests, 'vm.yaml'));
  // Reading it blocks in open(2) until a writer appears: none will.
  execFileSync('mkfifo', [join(manifests, 'zz-fifo.yaml')]);
  const run = startAgent(['--local', manifests, '--state-dir', join(dir.path, 'seeds')], dir.path);
  // A libuv pool thread waiting in the kernel's FIFO open: the read is stuck.
  await waitFor('a thread blocked opening the FIFO', () => blockedInFifoOpen(run.pid), 20_000);
  const { signal } = await sigtermAndWait(run);
  const exit = records(run.log()).find((r) => r.msg === 'exiting with work still pending');
  assert.ok(exit, run.log().slice(-2000));
  // process.exit() would have waited for the read: the default SIGTERM action ended it.
  assert.equal(signal, 'SIGTERM', run.log().slice(-2000));
  assert.ok(Object.keys(exit.pending as object).some((k) => k.startsWith('FSReq')), JSON.stringify(exit.pending));
  assert.match(String(exit.exit), /^SIGTERM/);
});

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
  assert.deepEqual(planExit(1, ['PipeWrap', 'ProcessWrap', 'TCPServerWrap']), { how: 'exit', code: 1, pending: ['ProcessWrap', 'TCPServerWrap'] });
  assert.deepEqual(planExit(1, ['FSReqPromise', 'Timeout']), { how: 'signal', pending: ['FSReqPromise'] });
  assert.equal(planExit(0, ['FSReqCallback']).how, 'signal');
  assert.equal(planExit(0, ['FSEventWrap']).how, 'exit', 'a watcher is not a stuck request');
  const calls: string[] = [];
  const lines: string[] = [];
  forceExit(3, 'test', { activeResources: () => ['ProcessWrap', 'ProcessWrap'], log: (l) => lines.push(l), exit: (c) => calls.push(`exit ${c}`), terminate: () => calls.push('terminate') });
  forceExit(3, 'test', { activeResources: () => ['FSReqPromise'], log: (l) => lines.push(l), exit: (c) => calls.push(`exit ${c}`), terminate: () => calls.push('terminate') });
  assert.deepEqual(calls, ['exit 3', 'terminate']);
  assert.deepEqual(JSON.parse(lines[0]!).pending, { ProcessWrap: 2 });
  assert.equal(JSON.parse(lines[0]!).reason, 'test');
});
