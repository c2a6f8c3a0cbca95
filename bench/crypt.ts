// node bench/crypt.ts [--n N] — cost of SHA-512 crypt in the render path:
// vmseed's TypeScript sha512Crypt (node:crypto SHA-512, 5000 rounds) against
// glibc's crypt(3) (through Python's crypt, timed inside Python) and against
// spawning `openssl passwd -6`, plus a whole renderSeed of an init with one
// password. Ratio = median / median of glibc crypt.
import { spawnSync } from 'node:child_process';
import { parseArgs } from 'node:util';
import { sha512Crypt } from '../src/cloudinit/crypt-sha512.ts';
import { MemoryResolver } from '../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../src/cloudinit/render.ts';

const { values } = parseArgs({ options: { n: { type: 'string', default: '200' } } });
const N = Number(values.n);
const PASSWORD = 'correct horse battery staple';
const SALT = 'saltsaltsaltsalt';

const pct = (sorted: number[], p: number) =>
  sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];

async function samples(fn: () => unknown | Promise<unknown>, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    await fn();
    out.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  return out.sort((a, b) => a - b);
}

const rows: Array<{ op: string; s: number[] }> = [];
rows.push({ op: 'vmseed sha512Crypt (TS)', s: await samples(() => sha512Crypt(PASSWORD, SALT), N) });

const py = spawnSync(
  '/usr/bin/python3',
  [
    '-W',
    'ignore',
    '-c',
    `
import crypt, json, time
out = []
for _ in range(${N}):
    t = time.perf_counter_ns(); crypt.crypt(${JSON.stringify(PASSWORD)}, "$6$${SALT}"); out.append((time.perf_counter_ns() - t) / 1e6)
print(json.dumps(sorted(out)))`,
  ],
  { encoding: 'utf8' },
);
if (py.status !== 0) throw new Error(py.stderr);
rows.push({ op: 'glibc crypt(3) via Python', s: JSON.parse(py.stdout) as number[] });

rows.push({
  op: 'openssl passwd -6 (spawn)',
  s: await samples(
    () => spawnSync('openssl', ['passwd', '-6', '-salt', SALT, '-stdin'], { input: `${PASSWORD}\n` }),
    Math.min(N, 100),
  ),
});

const vmi = {
  metadata: {
    name: 'bench',
    namespace: 'default',
    uid: 'u',
    annotations: {
      'vmseed.io/cloud-init':
        'init:\n  hostname: b\n  users: [{name: ops, passwordFrom: {name: pw}}]\n  nics: [{name: eth0, dhcp4: true}]\n',
    },
  },
  spec: {},
};
const refs = new MemoryResolver({
  secrets: [{ metadata: { name: 'pw', namespace: 'default' }, stringData: { password: PASSWORD } }],
});
rows.push({
  op: 'renderSeed, init with 1 password',
  s: await samples(() => renderSeed(vmi, refs, DEFAULT_RENDER_OPTIONS), N),
});

const ref = pct(rows[1].s, 50);
const w = Math.max(...rows.map((r) => r.op.length));
console.log(`n = ${N} (openssl: ${Math.min(N, 100)}); rounds 5000; ratio = median / median of glibc crypt(3)`);
console.log(`${'operation'.padEnd(w)} | median ms |  p99 ms | ratio`);
console.log(`${'-'.repeat(w)}-|-----------|---------|------`);
for (const r of rows) {
  const med = pct(r.s, 50);
  console.log(
    `${r.op.padEnd(w)} | ${med.toFixed(2).padStart(9)} | ${pct(r.s, 99).toFixed(2).padStart(7)} | ${(med / ref).toFixed(2).padStart(5)}`,
  );
}
