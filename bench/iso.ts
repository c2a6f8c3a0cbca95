// `npm run bench:iso`: vmseed's in-process seed image against the tools
// KubeVirt (xorrisofs) and cloud-localds/Virtlet (genisoimage) spawn, for
// 1 KiB, 16 KiB and 1 MiB of user-data. Prints a Markdown table: median and
// p99 wall time, image size, and each row's ratio to vmseed build + atomic
// write without fsync (the agent's path) in the same run.
// External tools are spawned once per run, as the systems they stand for do.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, statSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Seed } from '../src/cloudinit/seed.ts';
import { buildSeedImage } from '../src/disk/seed-image.ts';
import { nocloudFiles } from '../src/disk/nocloud.ts';
import { buildIso } from '../src/disk/iso9660.ts';
import { ImageStore } from '../src/disk/store.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 200);
const VMSEED_RUNS = Math.max(RUNS, Number(process.env.BENCH_VMSEED_RUNS ?? 2000));
const SIZES: Array<[string, number]> = [['1 KiB', 1024], ['16 KiB', 16 * 1024], ['1 MiB', 1024 * 1024]];

interface Row {
  size: string;
  what: string;
  runs: number;
  median: number;
  p99: number;
  bytes: number;
}

function stats(samples: number[]): { median: number; p99: number } {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)];
  return { median: at(0.5), p99: at(0.99) };
}

async function time(runs: number, fn: (i: number) => unknown | Promise<unknown>): Promise<number[]> {
  for (let i = 0; i < Math.min(50, runs); i++) await fn(-1 - i); // warm-up
  const out: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = process.hrtime.bigint();
    await fn(i);
    out.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return out;
}

function userData(size: number): Uint8Array {
  const head = '#cloud-config\nwrite_files:\n  - path: /etc/bench\n    content: |\n';
  const out = new Uint8Array(size).fill(0x61);
  out.set(new TextEncoder().encode(head));
  for (let i = head.length + 80; i < size; i += 81) out[i] = 0x0a;
  out[size - 1] = 0x0a;
  return out;
}

function spawnTool(cmd: string, args: string[]): void {
  const r = spawnSync(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  if (r.status !== 0) throw new Error(`${cmd} failed: ${r.stderr?.toString()}`);
}

function fsType(dir: string): string {
  const r = spawnSync('findmnt', ['-n', '-o', 'FSTYPE', '-T', dir]);
  return r.status === 0 ? r.stdout.toString().trim() : 'disk';
}

function fmt(ms: number): string {
  if (ms < 1) return `${(ms * 1000).toFixed(1)} µs`;
  return `${ms.toFixed(2)} ms`;
}

async function main(): Promise<void> {
  const work = mkdtempSync(join(tmpdir(), 'vmseed-bench-'));
  const shm = mkdtempSync(join('/dev/shm', 'vmseed-bench-'));
  const FS_DISK = fsType(work);
  const rows: Row[] = [];
  const key = { namespace: 'bench', name: 'vm', uid: 'u1' };
  try {
    for (const [label, size] of SIZES) {
      const seed: Seed = { datasource: 'nocloud', metaData: { 'instance-id': 'iid-bench', 'local-hostname': 'bench' }, userData: userData(size), warnings: [] };
      const base = Date.UTC(2026, 0, 1);
      // Each run gets a new timestamp, so every write really replaces the file.
      const ts = (i: number) => new Date(base + (i + 100) * 1000);
      let bytes = 0;
      const files = nocloudFiles(seed);
      const iso = await time(VMSEED_RUNS, (i) => buildIso({ label: 'cidata', files, timestamp: ts(i) }));
      rows.push({ size: label, what: 'vmseed buildIso (in memory, writer only)', runs: VMSEED_RUNS, ...stats(iso), bytes: buildIso({ label: 'cidata', files, timestamp: ts(0) }).length });
      const mem = await time(VMSEED_RUNS, (i) => {
        bytes = buildSeedImage(seed, ts(i)).bytes.length;
      });
      rows.push({ size: label, what: 'vmseed buildSeedImage (in memory, + layout + sha256)', runs: VMSEED_RUNS, ...stats(mem), bytes });

      const store = new ImageStore({ root: join(work, 'store') });
      const noSync = await time(VMSEED_RUNS, (i) => store.write(key, 'nocloud', buildSeedImage(seed, ts(i)).bytes, { fsync: false }));
      rows.push({ size: label, what: `vmseed build + atomic write, no fsync (${FS_DISK})`, runs: VMSEED_RUNS, ...stats(noSync), bytes });
      const same = buildSeedImage(seed, ts(0)).bytes;
      await store.write(key, 'nocloud', same, { fsync: false });
      const identical = await time(VMSEED_RUNS, () => store.write(key, 'nocloud', buildSeedImage(seed, ts(0)).bytes, { fsync: false }));
      rows.push({ size: label, what: `vmseed build + write of an identical image (no rewrite, ${FS_DISK})`, runs: VMSEED_RUNS, ...stats(identical), bytes });
      const withSync = await time(RUNS, (i) => store.write(key, 'nocloud', buildSeedImage(seed, ts(i + VMSEED_RUNS + 100)).bytes, { fsync: true }));
      rows.push({ size: label, what: `vmseed build + atomic write + fsync (${FS_DISK})`, runs: RUNS, ...stats(withSync), bytes });
      // The same on tmpfs: what is left once the filesystem's own cost (ext4
      // flushes data on rename-over-existing, auto_da_alloc) is taken away.
      const shmStore = new ImageStore({ root: join(shm, 'store') });
      const shmNoSync = await time(VMSEED_RUNS, (i) => shmStore.write(key, 'nocloud', buildSeedImage(seed, ts(i)).bytes, { fsync: false }));
      rows.push({ size: label, what: 'vmseed build + atomic write, no fsync (tmpfs)', runs: VMSEED_RUNS, ...stats(shmNoSync), bytes });

      const src = join(work, `src-${size}`);
      mkdirSync(src);
      for (const f of nocloudFiles(seed)) writeFileSync(join(src, f.path), f.data);
      const gOut = join(work, 'g.iso');
      const g = await time(RUNS, () => spawnTool('genisoimage', ['-quiet', '-volid', 'cidata', '-joliet', '-rock', '-o', gOut, src]));
      rows.push({ size: label, what: 'genisoimage -volid cidata -joliet -rock', runs: RUNS, ...stats(g), bytes: statSync(gOut).size });
      const xOut = join(work, 'x.iso');
      const x = await time(RUNS, () => {
        rmSync(xOut, { force: true });
        spawnTool('xorrisofs', ['-quiet', '-volid', 'cidata', '-joliet', '-rock', '-partition_cyl_align', 'on', '-o', xOut, src]);
      });
      rows.push({ size: label, what: 'xorrisofs -volid cidata -joliet -rock -partition_cyl_align on', runs: RUNS, ...stats(x), bytes: statSync(xOut).size });
      process.stderr.write(`bench:iso: ${label} done\n`);
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
    rmSync(shm, { recursive: true, force: true });
  }

  const lines = [
    `ISO seed image, NoCloud (user-data + meta-data), node ${process.version}, ${new Date().toISOString().slice(0, 10)}; ratios against the ${FS_DISK} build+write row`,
    '',
    '| user-data | method | runs | median | p99 | image bytes | median / vmseed build+write (no fsync) |',
    '|---|---|---:|---:|---:|---:|---:|',
  ];
  for (const r of rows) {
    const ref = rows.find((x) => x.size === r.size && x.what.startsWith('vmseed build + atomic write, no fsync'))!;
    lines.push(`| ${r.size} | ${r.what} | ${r.runs} | ${fmt(r.median)} | ${fmt(r.p99)} | ${r.bytes} | ${(r.median / ref.median).toFixed(r.median / ref.median < 10 ? 2 : 0)}× |`);
  }
  process.stdout.write(lines.join('\n') + '\n');
}

await main();
