// A libvirtd of the test's own, to kill, restart and SIGSTOP without
// disturbing the system daemon other test files use: session mode as the
// unprivileged `nobody` (libvirtd running as root is always the system
// daemon), with its runtime, config and cache directories in a temp dir.
// Root can still connect to its socket. It defines domains fine; nothing
// here starts one.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import {
  chownSync,
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  closeSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';

const run = promisify(execFile);
const NOBODY = 65534;

export interface PrivateLibvirtd {
  dir: string;
  socketPath: string;
  uri: string;
  pid(): number;
  signal(sig: NodeJS.Signals): void;
  // SIGKILL, then a new daemon on the same socket.
  restart(options?: { downMs?: number }): Promise<void>;
  virsh(...args: string[]): Promise<string>;
  define(xml: string): Promise<void>;
  stop(): Promise<void>;
}

export async function startPrivateLibvirtd(): Promise<PrivateLibvirtd> {
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-private-libvirtd-'));
  chmodSync(dir, 0o755);
  const sub = (n: string) => {
    const p = join(dir, n);
    mkdirSync(p);
    chownSync(p, NOBODY, NOBODY);
    chmodSync(p, 0o700);
    return p;
  };
  const env = {
    PATH: '/usr/sbin:/usr/bin:/bin',
    HOME: sub('home'),
    XDG_RUNTIME_DIR: sub('run'),
    XDG_CONFIG_HOME: sub('config'),
    XDG_CACHE_HOME: sub('cache'),
  };
  const socketPath = join(env.XDG_RUNTIME_DIR, 'libvirt', 'libvirt-sock');
  const uri = `qemu+unix:///session?socket=${socketPath}`;
  let child: ChildProcess | undefined;

  const virsh = async (...args: string[]) => (await run('virsh', ['-c', uri, ...args], { timeout: 30_000 })).stdout;

  const answers = async () => {
    try {
      await run('virsh', ['-c', uri, 'version'], { timeout: 5_000 });
      return true;
    } catch {
      return false;
    }
  };

  const launch = async () => {
    const log = openSync(join(dir, 'libvirtd.log'), 'a');
    child = spawn('setpriv', [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', '/usr/sbin/libvirtd'], {
      env,
      detached: true,
      stdio: ['ignore', log, log],
    });
    closeSync(log);
    child.unref();
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      if (existsSync(socketPath) && (await answers())) return;
      await sleep(50);
    }
    throw new Error(`private libvirtd did not answer on ${socketPath} within 30 s; see ${dir}/libvirtd.log`);
  };

  // ref(): the child is unref'd so a test file can end while it runs, but
  // while waiting for it to exit the wait must keep the process alive.
  const exited = (c: ChildProcess) =>
    new Promise<void>((resolve) => {
      if (c.exitCode !== null || c.signalCode !== null) return resolve();
      c.ref();
      c.once('exit', () => resolve());
    });

  const kill = async (sig: NodeJS.Signals) => {
    const c = child;
    if (!c || c.pid === undefined) return;
    try {
      process.kill(c.pid, 'SIGCONT');
    } catch {
      /* gone */
    }
    try {
      process.kill(c.pid, sig);
    } catch {
      /* gone */
    }
    await exited(c);
  };

  await launch();
  return {
    dir,
    socketPath,
    uri,
    pid: () => child?.pid ?? -1,
    signal: (sig) => {
      if (child?.pid !== undefined) process.kill(child.pid, sig);
    },
    restart: async (o = {}) => {
      await kill('SIGKILL');
      await sleep(o.downMs ?? 200);
      await launch();
    },
    virsh,
    define: async (xml) => {
      const f = join(dir, `define-${Date.now()}-${Math.random().toString(36).slice(2)}.xml`);
      writeFileSync(f, xml);
      try {
        await virsh('define', f);
      } finally {
        rmSync(f, { force: true });
      }
    },
    stop: async () => {
      await kill('SIGTERM');
      rmSync(dir, { recursive: true, force: true, maxRetries: 5 });
    },
  };
}
