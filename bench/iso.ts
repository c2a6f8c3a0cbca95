// `npm run bench:iso`: vmseed's in-process seed image against the tools
// KubeVirt (xorrisofs) and cloud-localds/Virtlet (genisoimage) spawn, for
// 1 KiB, 16 KiB and 1 MiB of user-data. Prints a Markdown table: median and
// p99 wall time, image size, and each row's ratio to vmseed build + atomic
// write without fsync of a new VMI's image (the agent's path when a VMI
// appears, which the 100x target is about) in the same run. Then the sizes
// against the size target (see sizeReport).
// External tools are spawned once per run, as the systems they stand for do.
import { spawnSync } from 'node:child_process';
import {
  closeSync,
  fchmodSync,
  fstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Seed } from '../src/cloudinit/seed.ts';
import { buildSeedImage, seedFiles } from '../src/disk/seed-image.ts';
import { nocloudFiles } from '../src/disk/nocloud.ts';
import { buildIso, MIN_SECTORS, SYSTEM_AREA_BYTES } from '../src/disk/iso9660.ts';
import { DEFAULT_SYNC_MAX_BYTES as STORE_SYNC_MAX, ImageStore } from '../src/disk/store.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 200);
const VMSEED_RUNS = Math.max(RUNS, Number(process.env.BENCH_VMSEED_RUNS ?? 2000));
const SIZES: Array<[string, number]> = [
  ['1 KiB', 1024],
  ['16 KiB', 16 * 1024],
  ['1 MiB', 1024 * 1024],
];

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

// The size target: the image for exactly 16 KiB of input (user-data +
// meta-data), and the largest user-data (with the bench's meta-data) that
// stays at the 68 KiB minimum. Arithmetic: src/disk/iso9660.ts header.
const MIN_BYTES = MIN_SECTORS * 2048;

function sizeReport(): string[] {
  const metaData = { 'instance-id': 'iid-bench', 'local-hostname': 'bench' };
  const image = (n: number) =>
    buildSeedImage({ datasource: 'nocloud', metaData, userData: userData(Math.max(n, 1)), warnings: [] }, new Date(0))
      .bytes.length;
  const md = seedFiles({ datasource: 'nocloud', metaData, userData: new Uint8Array(1), warnings: [] }).find(
    (f) => f.path === 'meta-data',
  )!.data.length;
  const u16 = 16 * 1024 - md;
  let lo = 1;
  let hi = 64 * 1024;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (image(mid) <= MIN_BYTES) lo = mid;
    else hi = mid - 1;
  }
  return [
    `Size: 16 KiB of input (user-data ${u16} B + meta-data ${md} B) → ${image(u16)} bytes (${image(u16) / 1024} KiB; target ≤ 64 KiB).`,
    `Size: largest user-data in the minimum ${MIN_BYTES / 1024} KiB image (meta-data ${md} B): ${lo} bytes (${(lo / 1024).toFixed(2)} KiB) → ${image(lo)} bytes; ${lo + 1} bytes → ${image(lo + 1)} bytes.`,
    'Floor: 25 sectors (16 system area + 3 descriptors + 4 path tables + 2 root directories) + one sector per started 2 KiB of each file, rounded to 4 KiB;',
    `never under ${MIN_BYTES} bytes (busybox volume_id reads 0x11000 bytes before it probes iso9660: a smaller seed is invisible to busybox-based guests).`,
  ];
}

async function main(): Promise<void> {
  const work = mkdtempSync(join(tmpdir(), 'vmseed-bench-'));
  const shm = mkdtempSync(join('/dev/shm', 'vmseed-bench-'));
  const FS_DISK = fsType(work);
  const rows: Row[] = [];
  const key = { namespace: 'bench', name: 'vm', uid: 'u1' };
  try {
    for (const [label, size] of SIZES) {
      const seed: Seed = {
        datasource: 'nocloud',
        metaData: { 'instance-id': 'iid-bench', 'local-hostname': 'bench' },
        userData: userData(size),
        warnings: [],
      };
      const base = Date.UTC(2026, 0, 1);
      // Each run gets a new timestamp, so every write really replaces the file.
      const ts = (i: number) => new Date(base + (i + 100) * 1000);
      let bytes = 0;
      const files = nocloudFiles(seed);
      const iso = await time(VMSEED_RUNS, (i) => buildIso({ label: 'cidata', files, timestamp: ts(i) }));
      rows.push({
        size: label,
        what: 'vmseed buildIso (in memory, writer only)',
        runs: VMSEED_RUNS,
        ...stats(iso),
        bytes: buildIso({ label: 'cidata', files, timestamp: ts(0) }).length,
      });
      const mem = await time(VMSEED_RUNS, (i) => {
        bytes = buildSeedImage(seed, ts(i)).bytes.length;
      });
      // As the agent calls it: the digest buildSeedImage computed names the file.
      const put = (st: ImageStore, k: { namespace: string; name: string; uid: string }, t: Date, fsync: boolean) => {
        const img = buildSeedImage(seed, t);
        return st.write(k, 'nocloud', img.bytes, { fsync, sha256: img.sha256 });
      };
      rows.push({
        size: label,
        what: 'vmseed buildSeedImage (in memory, + layout + sha256)',
        runs: VMSEED_RUNS,
        ...stats(mem),
        bytes,
      });

      // A new VMI: no image yet, its directory is created by the write.
      const REF = `vmseed build + atomic write, no fsync, new VMI (${FS_DISK})`;
      const store = new ImageStore({ root: join(work, 'store') });
      const fresh = (i: number) => ({
        namespace: 'bench',
        name: 'vm',
        uid: `new-${label.replace(/\W/g, '')}-${i + 100}`,
      });
      const first = await time(VMSEED_RUNS, (i) => put(store, fresh(i), ts(i), false));
      rows.push({ size: label, what: REF, runs: VMSEED_RUNS, ...stats(first), bytes });
      const asyncStore = new ImageStore({ root: join(work, 'store-async'), syncMaxBytes: 0 });
      const firstAsync = await time(VMSEED_RUNS, (i) => put(asyncStore, fresh(i), ts(i), false));
      rows.push({
        size: label,
        what: `… same through fs/promises only (the store's path above ${STORE_SYNC_MAX / 1024} KiB)`,
        runs: VMSEED_RUNS,
        ...stats(firstAsync),
        bytes,
      });
      // An update: a changed seed is a new content-addressed file next to the
      // old one (the reconciler prunes that after the injector replaced the
      // disk); no rename over an existing file.
      const noSync = await time(VMSEED_RUNS, (i) => put(store, key, ts(i), false));
      rows.push({
        size: label,
        what: `vmseed build + atomic write, no fsync, update: a new content-addressed file next to the old (${FS_DISK})`,
        runs: VMSEED_RUNS,
        ...stats(noSync),
        bytes,
      });
      const same = buildSeedImage(seed, ts(0)).bytes;
      await store.write(key, 'nocloud', same, { fsync: false });
      const identical = await time(VMSEED_RUNS, () => put(store, key, ts(0), false));
      rows.push({
        size: label,
        what: `vmseed build + write of an identical image (no rewrite, ${FS_DISK})`,
        runs: VMSEED_RUNS,
        ...stats(identical),
        bytes,
      });
      // The filesystem's own share of a new VMI's write: the calls the store
      // makes (mkdir, create the temporary, write past the zero system area,
      // fchmod, fstat, rename, close) on bytes built once: no build, no
      // hash, no JavaScript of ours. No build + write can beat it here.
      const built = buildSeedImage(seed, ts(0)).bytes;
      const floor = await time(VMSEED_RUNS, (i) => {
        const d = join(work, 'floor', `${label.replace(/\W/g, '')}_${i + 100}`);
        mkdirSync(d, { recursive: true, mode: 0o750 });
        const fd = openSync(join(d, '.tmp'), 'wx', 0o640);
        writeSync(fd, built, SYSTEM_AREA_BYTES, built.length - SYSTEM_AREA_BYTES, SYSTEM_AREA_BYTES);
        fchmodSync(fd, 0o640);
        fstatSync(fd);
        renameSync(join(d, '.tmp'), join(d, 'image.iso'));
        closeSync(fd);
      });
      rows.push({
        size: label,
        what: `filesystem floor: the same syscalls on prebuilt bytes, new VMI (${FS_DISK})`,
        runs: VMSEED_RUNS,
        ...stats(floor),
        bytes,
      });
      const withSync = await time(RUNS, (i) => put(store, fresh(i + VMSEED_RUNS + 100), ts(i), true));
      rows.push({
        size: label,
        what: `vmseed build + atomic write + fsync, new VMI (${FS_DISK})`,
        runs: RUNS,
        ...stats(withSync),
        bytes,
      });
      // The same on tmpfs: what is left once the filesystem's own cost is
      // taken away.
      const shmStore = new ImageStore({ root: join(shm, 'store') });
      const shmFirst = await time(VMSEED_RUNS, (i) => put(shmStore, fresh(i), ts(i), false));
      rows.push({
        size: label,
        what: 'vmseed build + atomic write, no fsync, new VMI (tmpfs)',
        runs: VMSEED_RUNS,
        ...stats(shmFirst),
        bytes,
      });
      const shmNoSync = await time(VMSEED_RUNS, (i) => put(shmStore, key, ts(i), false));
      rows.push({
        size: label,
        what: 'vmseed build + atomic write, no fsync, update (tmpfs)',
        runs: VMSEED_RUNS,
        ...stats(shmNoSync),
        bytes,
      });

      const src = join(work, `src-${size}`);
      mkdirSync(src);
      for (const f of nocloudFiles(seed)) writeFileSync(join(src, f.path), f.data);
      const gOut = join(work, 'g.iso');
      const g = await time(RUNS, () =>
        spawnTool('genisoimage', ['-quiet', '-volid', 'cidata', '-joliet', '-rock', '-o', gOut, src]),
      );
      rows.push({
        size: label,
        what: 'genisoimage -volid cidata -joliet -rock',
        runs: RUNS,
        ...stats(g),
        bytes: statSync(gOut).size,
      });
      const xOut = join(work, 'x.iso');
      const x = await time(RUNS, () => {
        rmSync(xOut, { force: true });
        spawnTool('xorrisofs', [
          '-quiet',
          '-volid',
          'cidata',
          '-joliet',
          '-rock',
          '-partition_cyl_align',
          'on',
          '-o',
          xOut,
          src,
        ]);
      });
      rows.push({
        size: label,
        what: 'xorrisofs -volid cidata -joliet -rock -partition_cyl_align on',
        runs: RUNS,
        ...stats(x),
        bytes: statSync(xOut).size,
      });
      process.stderr.write(`bench:iso: ${label} done\n`);
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
    rmSync(shm, { recursive: true, force: true });
  }

  const lines = [
    `ISO seed image, NoCloud (user-data + meta-data), node ${process.version}, ${new Date().toISOString().slice(0, 10)}; ratios against the ${FS_DISK} new-VMI build+write row`,
    '',
    '| user-data | method | runs | median | p99 | image bytes | median / vmseed build+write new VMI (no fsync) |',
    '|---|---|---:|---:|---:|---:|---:|',
  ];
  for (const r of rows) {
    const ref = rows.find(
      (x) => x.size === r.size && x.what.startsWith('vmseed build + atomic write, no fsync, new VMI'),
    )!;
    lines.push(
      `| ${r.size} | ${r.what} | ${r.runs} | ${fmt(r.median)} | ${fmt(r.p99)} | ${r.bytes} | ${(r.median / ref.median).toFixed(r.median / ref.median < 10 ? 2 : 0)}× |`,
    );
  }
  // What the 100x target (stated at 16 KiB) asks of the parts we cannot remove.
  const row = (prefix: string) => rows.find((r) => r.size === '16 KiB' && r.what.startsWith(prefix))!;
  const mem = row('vmseed buildSeedImage');
  const floor = row('filesystem floor');
  const g = row('genisoimage');
  const bound = mem.median + floor.median;
  lines.push(
    '',
    `Bound at 16 KiB: build + sha256 (${fmt(mem.median)}) + the filesystem floor (${fmt(floor.median)}) = ${fmt(bound)}, so a new VMI's build + write can be at most ${(g.median / bound).toFixed(0)}× faster than genisoimage (${fmt(g.median)}) on this ${FS_DISK}; 100× needs ≤ ${fmt(g.median / 100)}.`,
  );
  lines.push('', ...sizeReport());
  process.stdout.write(lines.join('\n') + '\n');
}

await main();
