// node bench/schema.ts [--n 200] [--n-large 30] [--agent] [--agent-vmis 100] [--agent-rounds 4]
//
// Cost of checking cloud-config against cloud-init's schemas
// (src/cloudinit/schema/check.ts), with the schema files of
// /usr/share/vmseed/cloud-init-schemas (or --dir):
//   1. checkSchemas per release (22.4, 25.1) for a typical ~2 KiB
//      cloud-config (users with ssh keys, packages, write_files, runcmd) and
//      a ~1 MiB one (many write_files entries and a long runcmd), median and
//      p99 after warm-up; and the compile of a release's cloud-config schema
//      on a fresh SchemaStore (the first one in the process, then repeats);
//   2. renderSeed of the same VMI (user-data from a Secret) with the check
//      off and on (release 25.1), the two alternated per round so noise hits
//      both alike; ratio = median on / median off;
//   3. heap used and RSS after compiling one release's schema against before
//      (after a forced GC);
//   4. with --agent: bench/agent.ts run twice with a small VMI count,
//      VMSEED_CLOUD_INIT_VERSION=off and the default, its cold start and
//      peak RSS lines side by side (about a minute more).
import '../test/support/schema-files.ts';
import { spawnSync } from 'node:child_process';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { parseArgs } from 'node:util';
import type { VmiObject } from '../src/api/objects.ts';
import { ANNOTATION } from '../src/cloudinit/annotation/annotation.ts';
import { MemoryResolver } from '../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed, type RenderOptions } from '../src/cloudinit/render.ts';
import { MAX_SCHEMA_BRANCHES, checkSchemas } from '../src/cloudinit/schema/check.ts';
import { CLOUD_INIT_RELEASES, DEFAULT_SCHEMA_DIR, SchemaStore } from '../src/cloudinit/schema/schema-store.ts';
import { parseYaml } from '../src/cloudinit/yaml.ts';
import { quantile } from './stats.ts';

const { values } = parseArgs({
  options: {
    n: { type: 'string', default: '200' },
    'n-large': { type: 'string', default: '30' },
    dir: { type: 'string', default: DEFAULT_SCHEMA_DIR },
    agent: { type: 'boolean', default: false },
    'agent-vmis': { type: 'string', default: '100' },
    'agent-rounds': { type: 'string', default: '4' },
  },
});
const N = Number(values.n);
const N_LARGE = Number(values['n-large']);
const DIR = values.dir;
const ROOT = new URL('../', import.meta.url).pathname;

// A forced GC without asking for --expose-gc on the command line.
setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

const MiB = 1024 * 1024;
const ms = (t: bigint) => Number(process.hrtime.bigint() - t) / 1e6;
const f2 = (x: number) => x.toFixed(2);

function table(head: string[], rows: string[][]): void {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (r: string[]) => `| ${r.map((c, i) => (i === 0 ? c.padEnd(w[i]) : c.padStart(w[i]))).join(' | ')} |`;
  console.log(line(head));
  console.log(`|${w.map((x, i) => (i === 0 ? '-'.repeat(x + 2) : `${'-'.repeat(x + 1)}:`)).join('|')}|`);
  for (const r of rows) console.log(line(r));
  console.log('');
}

// --- the documents ---------------------------------------------------------

const KEY = (i: number) =>
  `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI${Buffer.alloc(32, i).toString('base64').slice(0, 43)} user${i}@example.com`;

function typicalConfig(): string {
  return `#cloud-config
hostname: web-01
fqdn: web-01.example.com
manage_etc_hosts: true
timezone: Europe/Berlin
users:
  - default
  - name: ops
    gecos: Operations
    groups: [adm, sudo, docker]
    sudo: ALL=(ALL) NOPASSWD:ALL
    shell: /bin/bash
    lock_passwd: true
    ssh_authorized_keys:
      - ${KEY(1)}
      - ${KEY(2)}
  - name: deploy
    groups: [www-data]
    shell: /bin/bash
    ssh_authorized_keys:
      - ${KEY(3)}
ssh_pwauth: false
package_update: true
package_upgrade: false
packages:
  - nginx
  - curl
  - jq
  - [docker.io, 24.0.7-0ubuntu4]
  - prometheus-node-exporter
write_files:
  - path: /etc/nginx/sites-available/default
    owner: root:root
    permissions: '0644'
    content: |
      server {
        listen 80 default_server;
        root /var/www/html;
        location / { try_files $uri $uri/ =404; }
        location /healthz { return 200 'ok'; }
      }
  - path: /etc/sysctl.d/99-bench.conf
    content: |
      net.core.somaxconn = 4096
      vm.swappiness = 10
  - path: /usr/local/bin/bootstrap.sh
    permissions: '0755'
    defer: true
    content: |
      #!/bin/sh
      set -eu
      systemctl enable --now nginx docker
      curl -fsS http://169.254.169.254/ >/dev/null || true
ntp:
  enabled: true
  servers: [0.pool.ntp.org, 1.pool.ntp.org]
runcmd:
  - [systemctl, daemon-reload]
  - [sysctl, --system]
  - /usr/local/bin/bootstrap.sh
  - echo "booted $(date -Is)" >> /var/log/bench-boot.log
final_message: "cloud-init finished after $UPTIME seconds"
`;
}

// Under --max-user-data-bytes' 1 MiB default: write_files entries of ~900
// bytes of content each, and a runcmd list of a few thousand commands.
function largeConfig(): string {
  const parts = [typicalConfig().replace(/\nruncmd:[\s\S]*$/, '\n')];
  parts.push('write_files:\n');
  const body = `${'x'.repeat(70)}\n`.repeat(12);
  const blockBody = body.replace(/^/gm, '      ').trimEnd();
  let n = 0;
  let size = parts[0].length;
  const out: string[] = [];
  while (size < 0.7 * MiB) {
    const e = `  - path: /opt/app/conf.d/${String(n).padStart(5, '0')}.conf\n    owner: root:root\n    permissions: '0644'\n    content: |\n${blockBody}\n`;
    out.push(e);
    size += e.length;
    n++;
  }
  // The typical config's write_files, replaced by the large list.
  parts[0] = parts[0].replace(/\nwrite_files:[\s\S]*?\nntp:/, '\nntp:');
  parts.push(...out, 'runcmd:\n');
  let i = 0;
  size = parts.reduce((a, p) => a + p.length, 0);
  while (size < MiB - 4096) {
    const c = `  - [sh, -c, "echo step ${i} >> /var/log/bench-steps.log && test -f /opt/app/conf.d/${String(i % n).padStart(5, '0')}.conf"]\n`;
    parts.push(c);
    size += c.length;
    i++;
  }
  return parts.join('');
}

const DOCS = [
  { name: '2 KiB', text: typicalConfig(), n: N },
  { name: '1 MiB', text: largeConfig(), n: N_LARGE },
];
const bytes = (s: string) => Buffer.byteLength(s);

// --- 3. memory (first, before anything else is compiled) ---------------------

// The documents as checkSchemas hands them to the validator (neither has
// !!binary, so no normalising is needed).
const parsed = DOCS.map((d) => {
  const r = parseYaml(d.text, { yaml11: true, allowDuplicateKeys: true, field: 'user-data' });
  if (!r.ok) throw new Error(`${d.name}: ${r.reason}`);
  return r.value;
});

gc();
const before = process.memoryUsage();
const held = new SchemaStore(DIR);
let t = process.hrtime.bigint();
const first = held.validator('25.1', 'cloud-config');
const firstMs = ms(t);
if (!first.ok) throw new Error(`cloud-init 25.1 schema: ${first.reason} (--dir ${DIR})`);
gc();
const compiled = process.memoryUsage();
// ajv compiles anyOf/oneOf branches lazily, on the first document that reaches them.
t = process.hrtime.bigint();
first.validator.validate(parsed[0], MAX_SCHEMA_BRANCHES);
const firstValidateMs = ms(t);
gc();
const checkedSmall = process.memoryUsage();
first.validator.validate(parsed[1], MAX_SCHEMA_BRANCHES);
gc();
const after = process.memoryUsage();

// --- 1. compile and validate ---------------------------------------------------

const compileRows: string[][] = [];
for (const release of CLOUD_INIT_RELEASES) {
  const c: number[] = [];
  const v: number[][] = [[], []];
  for (let i = 0; i < 10; i++) {
    const store = new SchemaStore(DIR);
    t = process.hrtime.bigint();
    const found = store.validator(release, 'cloud-config');
    c.push(ms(t));
    if (!found.ok) throw new Error(`cloud-init ${release} schema: ${found.reason}`);
    parsed.forEach((d, j) => {
      t = process.hrtime.bigint();
      found.validator.validate(d, MAX_SCHEMA_BRANCHES);
      v[j].push(ms(t));
    });
  }
  compileRows.push([
    release,
    release === '25.1' ? `${f2(firstMs)} + ${f2(firstValidateMs)}` : '—',
    f2(quantile(c, 0.5)),
    f2(Math.max(...c)),
    f2(quantile(v[0], 0.5)),
    f2(quantile(v[1], 0.5)),
  ]);
}

const validateRows: string[][] = [];
for (const doc of DOCS) {
  const userData = new Uint8Array(Buffer.from(doc.text));
  const refMed: Record<string, number> = {};
  for (const release of CLOUD_INIT_RELEASES) {
    const run = () => checkSchemas({ dir: DIR, release, reveal: false, userData });
    const r = run();
    if (r.problems.length || r.unchecked.length)
      throw new Error(`${doc.name} on ${release}: ${JSON.stringify([r.problems[0], r.unchecked[0]])}`);
    for (let i = 0; i < Math.min(20, Math.ceil(doc.n / 5)); i++) run();
    const s: number[] = [];
    for (let i = 0; i < doc.n; i++) {
      t = process.hrtime.bigint();
      run();
      s.push(ms(t));
    }
    refMed[release] = quantile(s, 0.5);
    validateRows.push([
      `${doc.name} (${bytes(doc.text)} B)`,
      release,
      String(doc.n),
      f2(quantile(s, 0.5)),
      f2(quantile(s, 0.99)),
      (refMed[release] / refMed['22.4']).toFixed(2),
    ]);
  }
}

// --- 2. renderSeed with the check off and on ------------------------------------

const vmi: VmiObject = {
  metadata: {
    name: 'bench',
    namespace: 'default',
    uid: 'u',
    annotations: { [ANNOTATION]: 'userDataSecretRef: {name: ud}\n' },
  },
  spec: {},
};
const OFF: RenderOptions = DEFAULT_RENDER_OPTIONS;
const ON: RenderOptions = { ...DEFAULT_RENDER_OPTIONS, schemaCheck: { dir: DIR, release: '25.1' } };

const renderRows: string[][] = [];
for (const doc of DOCS) {
  const refs = new MemoryResolver({
    secrets: [{ metadata: { name: 'ud', namespace: 'default' }, stringData: { userdata: doc.text } }],
  });
  const render = async (o: RenderOptions) => {
    const out = await renderSeed(vmi, refs, o);
    if (out.kind !== 'seed') throw new Error(`${doc.name}: ${JSON.stringify(out).slice(0, 300)}`);
    return out.seed;
  };
  const checked = await render(ON);
  const codes = checked.warnings.map((w) => w.code).filter((c) => c.startsWith('CLOUD'));
  if (codes.length) throw new Error(`${doc.name}: schema warnings ${codes.join(', ')}`);
  const off: number[] = [];
  const on: number[] = [];
  for (let i = 0; i < Math.min(10, Math.ceil(doc.n / 5)); i++) {
    await render(OFF);
    await render(ON);
  }
  for (let i = 0; i < doc.n; i++) {
    // Alternate which goes first, too.
    for (const [o, s] of i % 2
      ? ([
          [OFF, off],
          [ON, on],
        ] as const)
      : ([
          [ON, on],
          [OFF, off],
        ] as const)) {
      t = process.hrtime.bigint();
      await render(o);
      s.push(ms(t));
    }
  }
  renderRows.push([
    `${doc.name} (${bytes(doc.text)} B)`,
    String(doc.n),
    f2(quantile(off, 0.5)),
    f2(quantile(off, 0.99)),
    f2(quantile(on, 0.5)),
    f2(quantile(on, 0.99)),
    (quantile(on, 0.5) / quantile(off, 0.5)).toFixed(2),
  ]);
}

// --- output -------------------------------------------------------------------

console.log(`schemas: ${DIR}; node ${process.version}; n = ${N} (1 MiB: ${N_LARGE}) after warm-up\n`);
console.log("### Compiling a release's cloud-config schema (fresh SchemaStore, ms)\n");
table(
  [
    'release',
    'first in process: compile + first 2 KiB validate',
    'compile, median of 10',
    'compile, max of 10',
    'then first 2 KiB validate',
    'then first 1 MiB validate',
  ],
  compileRows,
);
console.log('### checkSchemas (user-data, reveal off; ratio = median / median on 22.4)\n');
table(['cloud-config', 'release', 'n', 'median ms', 'p99 ms', 'ratio'], validateRows);
console.log('### renderSeed, user-data from a Secret, check off vs on (25.1), alternated per round\n');
table(['user-data', 'rounds', 'off median ms', 'off p99 ms', 'on median ms', 'on p99 ms', 'on / off'], renderRows);
console.log(
  "### Memory: 25.1's cloud-config schema compiled, then its lazy branches (first 2 KiB check), then a 1 MiB check; forced GC before each reading\n",
);
const mb = (x: number) => (x / MiB).toFixed(1);
table(
  ['', 'before MiB', 'compiled MiB', 'after 2 KiB check MiB', 'delta MiB', 'after 1 MiB check MiB'],
  (['heapUsed', 'rss', 'external'] as const).map((k) => [
    k,
    mb(before[k]),
    mb(compiled[k]),
    mb(checkedSmall[k]),
    mb(checkedSmall[k] - before[k]),
    mb(after[k]),
  ]),
);
void held;

// --- 4. the agent, check off vs on ------------------------------------------------

if (!values.agent) {
  console.log('(agent cold start with the check off vs on: run with --agent, about a minute more)');
} else {
  const vmis = values['agent-vmis'];
  const rounds = Number(values['agent-rounds']);
  const variants = [
    ['off', 'off'],
    ['default (25.1)', undefined],
  ] as const;
  // Per variant: cold start s, event → image median and p99 ms, peak RSS MB, one entry per round.
  const got = new Map<string, number[][]>(variants.map(([label]) => [label, [[], [], [], []]]));
  for (let round = 0; round < rounds; round++) {
    // Alternated, so that whatever else runs on the machine hits both alike.
    const order = round % 2 === 0 ? variants : [...variants].reverse();
    for (const [label, version] of order) {
      const env = { ...process.env };
      if (version) env.VMSEED_CLOUD_INIT_VERSION = version;
      else delete env.VMSEED_CLOUD_INIT_VERSION;
      const r = spawnSync(
        process.execPath,
        [`${ROOT}bench/agent.ts`, '--vmis', vmis, '--events', '20', '--idle-seconds', '1', '--api', 'kubeconfig'],
        { env, encoding: 'utf8', timeout: 180_000 },
      );
      if (r.status !== 0) throw new Error(`bench/agent.ts (${label}): ${r.stderr || r.error}`);
      const out = r.stdout.split('\n');
      const pick = (re: RegExp): number =>
        Number.parseFloat(
          out
            .find((l) => re.test(l))
            ?.split('|')[2]
            ?.trim() ?? 'NaN',
        );
      const series = got.get(label)!;
      [/cold start/, /image on disk, median/, /image on disk, p99/, /peak RSS/].forEach((re, i) =>
        series[i].push(pick(re)),
      );
    }
  }
  const med = (xs: number[]): number => quantile(xs, 0.5);
  const off = got.get('off')!;
  const rows = variants.map(([label]) => {
    const v = got.get(label)!;
    return [
      label,
      `${med(v[0]).toFixed(2)} s (${(med(v[0]) / med(off[0])).toFixed(2)}×)`,
      `${med(v[1]).toFixed(2)} ms`,
      `${med(v[2]).toFixed(2)} ms`,
      `${med(v[3]).toFixed(1)} MB (${(med(v[3]) / med(off[3])).toFixed(2)}×)`,
    ];
  });
  console.log(
    `### Agent: bench/agent.ts --vmis ${vmis} --events 20 --idle-seconds 1 --api kubeconfig, VMSEED_CLOUD_INIT_VERSION; medians of ${rounds} alternated rounds\n`,
  );
  table(
    ['--cloud-init-version', `cold start, ${vmis} VMIs (÷ off)`, 'event → image median', 'p99', 'peak RSS (÷ off)'],
    rows,
  );
}
