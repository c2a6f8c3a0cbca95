// Helpers for running the real readers (bsdtar, xorriso, isoinfo, blkid, 7z,
// cloud-init's Python) against images in a temporary directory.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const HERE = fileURLToPath(new URL('.', import.meta.url));

export function run(cmd: string, args: string[], input?: Uint8Array): { stdout: Buffer; stderr: string } {
  const r = spawnSync(cmd, args, { input, maxBuffer: 256 << 20 });
  if (r.error) throw r.error;
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}: ${r.stderr.toString()}`);
  return { stdout: r.stdout, stderr: r.stderr.toString() };
}

export function tempDir(prefix = 'vmseed-disk-'): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

export function writeImage(dir: string, name: string, bytes: Uint8Array): string {
  const p = join(dir, name);
  writeFileSync(p, bytes);
  return p;
}

// Every regular file under dir, by relative path.
export function readTree(dir: string, prefix = ''): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  for (const name of readdirSync(join(dir, prefix))) {
    const rel = prefix ? `${prefix}/${name}` : name;
    const st = statSync(join(dir, rel));
    if (st.isDirectory()) for (const [k, v] of readTree(dir, rel)) out.set(k, v);
    else out.set(rel, readFileSync(join(dir, rel)));
  }
  return out;
}

export function bsdtarExtract(iso: string, into: string): Map<string, Buffer> {
  run('bsdtar', ['-xf', iso, '-C', into]);
  return readTree(into);
}

export function blkid(iso: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of run('blkid', ['-p', '-o', 'export', iso]).stdout.toString().split('\n')) {
    const eq = line.indexOf('=');
    if (eq > 0) out[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return out;
}

// `xorriso -indev X -find`: quoted paths like './openstack/latest'.
export function xorrisoFind(iso: string): string[] {
  const out = run('xorriso', ['-indev', iso, '-find']).stdout.toString();
  return out
    .split('\n')
    .filter((l) => l.startsWith("'./"))
    .map((l) => l.slice(3, -1))
    .sort();
}

// Paths from `isoinfo -l` listings (with -R or -J), directories included.
export function isoinfoPaths(iso: string, ext: '-R' | '-J'): string[] {
  // isoinfo prints Joliet (UCS-2) names in a single-byte charset, no UTF-8:
  // Latin-1, decoded as such (names beyond U+00FF cannot be compared here).
  const out =
    ext === '-J'
      ? run('isoinfo', ['-J', '-j', 'iso8859-1', '-l', '-i', iso]).stdout.toString('latin1')
      : run('isoinfo', ['-R', '-l', '-i', iso]).stdout.toString();
  const paths: string[] = [];
  let dir = '';
  for (const line of out.split('\n')) {
    const m = /^Directory listing of \/(.*)$/.exec(line);
    if (m) {
      dir = m[1];
      continue;
    }
    const e = /^[-d][-rwxsStT]{9}\s.*\]\s\s(.*) $/.exec(line);
    if (!e || e[1] === '.' || e[1] === '..' || e[1] === '') continue;
    paths.push(dir + e[1]);
  }
  return paths.sort();
}

export function sevenZipPaths(iso: string): string[] {
  const out = run('7z', ['l', '-slt', iso]).stdout.toString();
  return out
    .split('\n')
    .filter((l) => l.startsWith('Path = '))
    .map((l) => l.slice(7))
    .filter((p) => p !== iso)
    .sort();
}

// cloud-init's own readers on an extracted tree; bytes come back base64.
export function cloudinitRead(mode: 'nocloud' | 'configdrive', dir: string): Record<string, unknown> {
  const out = run('/usr/bin/python3', [join(HERE, 'cloudinit_read.py'), mode, dir]).stdout.toString();
  return JSON.parse(out) as Record<string, unknown>;
}
