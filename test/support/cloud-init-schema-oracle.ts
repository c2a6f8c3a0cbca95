// The real cloud-init of each Debian release as the oracle for cloud-config
// and network-config schema validation: Debian 12's 22.4 (the host's
// installed cloud-init) and Debian 13's 25.1 (trixie's package, extracted by
// ensureCloudInitRelease()). Both run under /usr/bin/python3, Debian's own
// Python with Debian's jsonschema: the `python3` on PATH may be another
// Python with another jsonschema. One Python process validates a whole batch
// (cloud-init-schema-oracle.py describes what it calls and reports).
import { execFile, spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureCloudInitRelease } from './cloud-init-release.ts';

export type OracleRelease = '22.4' | '25.1';
export type OracleFileType = 'cloud-config' | 'network-config';

export interface OracleProblem {
  path: string; // cloud-init's dotted path: `runcmd`, `users.0.sudo`, `format-l1.c1`
  message: string;
}

export interface OracleResult {
  errors: OracleProblem[];
  deprecations: OracleProblem[];
  exception?: string; // `RuntimeError: ...`: raised other than as a schema error
  unsupported?: boolean; // network-config under 22.4, which ships no network schema
  skipped?: string; // 25.1 validated nothing (empty file, a non-cloud-config user-data type): what it printed
}

const PYTHON = '/usr/bin/python3';
const DRIVER = path.join(path.dirname(fileURLToPath(import.meta.url)), 'cloud-init-schema-oracle.py');
const TIMEOUT_MS = 120_000;

// The environment for a release's Python: only that release's cloudinit in
// front of Debian's dist-packages, no user site, no inherited PYTHONPATH.
async function pythonEnv(release: OracleRelease): Promise<NodeJS.ProcessEnv> {
  const env: NodeJS.ProcessEnv = { ...process.env, PYTHONNOUSERSITE: '1', PYTHONUTF8: '1' };
  delete env.PYTHONPATH;
  delete env.PYTHONHOME;
  if (release === '25.1') env.PYTHONPATH = await ensureCloudInitRelease();
  return env;
}

export async function runSchemaOracle(
  release: OracleRelease,
  files: { path: string; type: OracleFileType }[],
): Promise<Map<string, OracleResult>> {
  const env = await pythonEnv(release);
  const input = JSON.stringify(files.map((f) => ({ path: path.resolve(f.path), type: f.type })));
  const { code, signal, stdout, stderr, timedOut } = await new Promise<{
    code: number | null;
    signal: NodeJS.Signals | null;
    stdout: string;
    stderr: string;
    timedOut: boolean;
  }>((resolve, reject) => {
    const child = spawn(PYTHON, [DRIVER, release], { env, stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let timedOut = false;
    child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (err += d));
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, TIMEOUT_MS);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout: out, stderr: err, timedOut });
    });
    // The driver may exit before reading everything (a wrong release on the path).
    child.stdin.on('error', () => {});
    child.stdin.end(input);
  });
  if (timedOut || code !== 0) {
    const why = timedOut ? `killed after ${TIMEOUT_MS} ms` : `exit ${code ?? signal}`;
    throw new Error(`cloud-init ${release} schema oracle failed (${why}): ${stderr.slice(-4000)}`);
  }
  let parsed: Record<string, OracleResult>;
  try {
    parsed = JSON.parse(stdout) as Record<string, OracleResult>;
  } catch {
    throw new Error(`cloud-init ${release} schema oracle printed no JSON: ${stdout.slice(0, 2000)} ${stderr}`);
  }
  // Keyed by the caller's paths, as given.
  const results = new Map<string, OracleResult>();
  for (const f of files) {
    const r = parsed[path.resolve(f.path)];
    if (r === undefined) throw new Error(`cloud-init ${release} schema oracle has no result for ${f.path}`);
    results.set(f.path, r);
  }
  return results;
}

// The real `cloud-init schema --config-file FILE` of a release (exit code and
// output as a user sees them).
export async function runCloudInitSchemaCli(
  release: OracleRelease,
  file: string,
  type: OracleFileType = 'cloud-config',
): Promise<{ code: number; stdout: string; stderr: string }> {
  const env = await pythonEnv(release);
  const args = ['-m', 'cloudinit.cmd.main', 'schema', '--config-file', file];
  // 22.4's CLI has no --schema-type (cloud-config only).
  if (type !== 'cloud-config') args.push('--schema-type', type);
  return new Promise((resolve, reject) => {
    execFile(
      PYTHON,
      args,
      { env, timeout: TIMEOUT_MS, killSignal: 'SIGKILL', encoding: 'utf8', maxBuffer: 16 * 1024 * 1024 },
      (err, stdout, stderr) => {
        if (err && (err.killed || typeof err.code !== 'number')) {
          reject(new Error(`cloud-init ${release} schema --config-file ${file} failed: ${err.message} ${stderr}`));
          return;
        }
        resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
      },
    );
  });
}
