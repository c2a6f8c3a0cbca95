// Runs virsh safely: no shell, argument arrays, a timeout that kills the
// whole process group (a wrapper script's children too), bounded output, and
// virsh's `error:` lines turned into stable VmseedError codes.
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cancelledBy, VmseedError } from '../../errors.ts';
import { holdSocket, type HeldSocket } from '../rpc/socket-hold.ts';
import { CHILD_SOCKET_PATH, dialForVirsh } from './dial.ts';
import { LIBVIRT_ERROR_RULES } from '../error-rules.ts';

export interface SpawnOptions {
  timeoutMs: number;
  maxOutputBytes: number;
  env?: Record<string, string | undefined>;
  // The agent is stopping: the whole group is killed, as on a timeout.
  signal?: AbortSignal;
  // Descriptors the child inherits as 3, 4, ... (a held libvirt socket).
  fds?: readonly number[];
}

export interface SpawnResult {
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  outputTruncated: boolean;
  // Killed because options.signal was aborted.
  aborted?: boolean;
  // The executable could not be started (ENOENT/EACCES).
  spawnError?: 'not-found' | 'not-executable';
}

/**
 * The only place a process is started, and where the libvirt socket it is
 * to dial is held (virsh-dial.ts); tests pass a fake.
 */
export interface ProcessSpawner {
  run(file: string, args: readonly string[], options: SpawnOptions): Promise<SpawnResult>;
  // Throws as holdSocket does (libvirt/rpc/socket-hold.ts).
  holdSocket(socketPath: string): HeldSocket;
}

/**
 * The real ProcessSpawner: no shell, the child in a process group of its
 * own that a timeout, the output bound or the signal kills whole. run()
 * resolves with how the process ended (timed out, truncated, aborted, not
 * startable) rather than rejecting.
 */
export class NodeProcessSpawner implements ProcessSpawner {
  holdSocket(socketPath: string): HeldSocket {
    return holdSocket(socketPath);
  }

  run(file: string, args: readonly string[], options: SpawnOptions): Promise<SpawnResult> {
    return new Promise((resolve) => {
      // detached: the child leads its own process group, so the timeout can
      // kill everything it started (no orphaned `sleep` under a wrapper).
      const child = spawn(file, args, {
        shell: false,
        detached: true,
        stdio: ['ignore', 'pipe', 'pipe', ...(options.fds ?? [])],
        env: options.env,
      });
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      let size = 0;
      let timedOut = false;
      let truncated = false;
      let settled = false;
      const killGroup = () => {
        if (child.pid === undefined) return;
        try {
          process.kill(-child.pid, 'SIGKILL');
        } catch {
          /* already gone */
        }
      };
      const collect = (bucket: Buffer[]) => (chunk: Buffer) => {
        if (truncated) return;
        size += chunk.length;
        if (size > options.maxOutputBytes) {
          truncated = true;
          killGroup();
          return;
        }
        bucket.push(chunk);
      };
      // Piped above, whatever descriptors follow.
      child.stdout!.on('data', collect(out));
      child.stderr!.on('data', collect(err));
      const timer = setTimeout(() => {
        timedOut = true;
        killGroup();
      }, options.timeoutMs);
      let aborted = false;
      const onAbort = () => {
        aborted = true;
        killGroup();
      };
      options.signal?.addEventListener('abort', onAbort, { once: true });
      if (options.signal?.aborted) onAbort();
      const finish = (r: Partial<SpawnResult>) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
        resolve({
          exitCode: null,
          signal: null,
          stdout: Buffer.concat(out).toString('utf8'),
          stderr: Buffer.concat(err).toString('utf8'),
          timedOut,
          outputTruncated: truncated,
          ...(aborted ? { aborted } : {}),
          ...r,
        });
      };
      child.on('error', (e: NodeJS.ErrnoException) => {
        finish({ spawnError: e.code === 'EACCES' ? 'not-executable' : 'not-found' });
      });
      // 'close' waits for the pipes: after a group kill they close too.
      child.on('close', (code, signal) => {
        // Reap anything left in the group even on a normal exit of the leader.
        if (timedOut || truncated || aborted) killGroup();
        finish({ exitCode: code, signal });
      });
    });
  }
}

export interface VirshOptions {
  virshPath: string;
  uri: string;
  timeoutMs: number;
  maxOutputBytes: number;
  spawner?: ProcessSpawner;
  // The reconcile's: aborted, virsh is killed (or not started) and the call
  // ends with CANCELLED.
  signal?: AbortSignal;
}

// Stands in an argument list for the path of a file holding `xml`.
// (virsh cannot read /dev/stdin when stdin is a socket, as Node's pipes are.)
export const XML_FILE = Symbol('xml-file');
export type VirshArg = string | typeof XML_FILE;

export interface VirshCallOptions {
  xml?: string;
}

export function errorLines(stderr: string): string[] {
  return stderr
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.startsWith('error:'))
    .map((l) => l.slice('error:'.length).trim());
}

// The most specific line decides: virsh prints a generic `Failed to attach
// device from X` first and libvirt's reason after it.
export function classifyVirshError(stderr: string, command: string): VmseedError {
  const lines = errorLines(stderr);
  const detail = (lines.length ? lines.join('; ') : (stderr.trim().split('\n').pop() ?? '')).slice(0, 500);
  for (const line of [...lines].reverse()) {
    for (const r of LIBVIRT_ERROR_RULES) {
      if (r.test.test(line)) {
        return new VmseedError(r.code, `virsh ${command}: ${detail}; ${r.hint}`, { kind: r.kind });
      }
    }
  }
  return new VmseedError(
    'VIRSH_FAILED',
    `virsh ${command} failed: ${detail || 'no error message'}; see the libvirtd log`,
    { kind: 'retryable' },
  );
}

export class Virsh {
  readonly virshPath: string;
  readonly uri: string;
  readonly timeoutMs: number;
  readonly maxOutputBytes: number;
  readonly #spawner: ProcessSpawner;
  readonly #signal: AbortSignal | undefined;

  constructor(options: VirshOptions) {
    this.virshPath = options.virshPath;
    this.uri = options.uri;
    this.timeoutMs = options.timeoutMs;
    this.maxOutputBytes = options.maxOutputBytes;
    this.#spawner = options.spawner ?? new NodeProcessSpawner();
    this.#signal = options.signal;
  }

  // Runs `virsh -c URI ARGS...`, returns stdout, throws a typed VmseedError.
  async run(args: readonly VirshArg[], options: VirshCallOptions = {}): Promise<string> {
    if (!args.includes(XML_FILE)) return this.#run(args as string[]);
    if (options.xml === undefined)
      throw new VmseedError('INTERNAL', 'virsh call with XML_FILE but no xml', { kind: 'terminal' });
    // A private directory (0700) per call: no other user can swap the file.
    const dir = await mkdtemp(join(tmpdir(), 'vmseed-virsh-'));
    try {
      const file = join(dir, 'device.xml');
      await writeFile(file, options.xml, { mode: 0o600 });
      return await this.#run(args.map((a) => (a === XML_FILE ? file : a)));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  async #run(args: readonly string[]): Promise<string> {
    const command = args[0] ?? '';
    if (this.#signal?.aborted) throw cancelledBy(this.#signal, `virsh ${command}`);
    const dial = dialForVirsh(this.uri, (p) => this.#spawner.holdSocket(p));
    let r: SpawnResult;
    try {
      r = await this.#spawner.run(this.virshPath, ['-q', '-c', dial.uri, ...args], {
        timeoutMs: this.timeoutMs,
        maxOutputBytes: this.maxOutputBytes,
        // English messages, so classification works whatever the host locale.
        env: { ...process.env, LC_ALL: 'C', LANG: 'C' },
        fds: dial.fds,
        ...(this.#signal ? { signal: this.#signal } : {}),
      });
    } finally {
      dial.close();
    }
    if (r.aborted) throw cancelledBy(this.#signal, `virsh ${command}`);
    // libvirt's messages name the socket virsh dialled: the configured one.
    if (dial.socketPath !== undefined) r = { ...r, stderr: r.stderr.replaceAll(CHILD_SOCKET_PATH, dial.socketPath) };
    if (r.spawnError) {
      throw new VmseedError(
        'VIRSH_NOT_FOUND',
        `cannot run virsh at '${this.virshPath}' (${r.spawnError}); install libvirt-clients or fix --virsh-path`,
        { kind: 'terminal', field: 'virshPath' },
      );
    }
    if (r.timedOut) {
      throw new VmseedError(
        'VIRSH_TIMEOUT',
        `virsh ${command} did not finish within ${this.timeoutMs} ms and was killed; libvirtd may be stuck; will retry`,
        { kind: 'retryable' },
      );
    }
    if (r.outputTruncated) {
      throw new VmseedError(
        'VIRSH_FAILED',
        `virsh ${command} wrote more than ${this.maxOutputBytes} bytes and was killed; raise the output limit`,
        { kind: 'retryable' },
      );
    }
    if (r.exitCode !== 0) throw classifyVirshError(r.stderr, command);
    return r.stdout;
  }
}
