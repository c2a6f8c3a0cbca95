// bench:webhook: AdmissionReviews of a VMI (the KubeVirt-shaped one of the
// tests, its serial minted) sent at a fixed rate to the admission webhook
// over loopback HTTPS (keep-alive connections, as the API server keeps
// them), open loop: each latency counts from when the request was due.
// Prints the median, p99 and max, and the errors (any answer other than
// 200 with a patch); and, to tell the webhook's own work from the machine's
// load, the same percentiles of parsing, patching and answering one review
// in process, without the network.
// Two kinds of review, in alternated rounds on one server: that VMI
// (gated, no adoption), and a Cluster API VMI asking for its ConfigDrive
// volume's adoption (test/fixtures/adoption/capk-controlplane.json), whose
// bootstrap Secret the webhook reads over HTTPS from a fake API server (on a
// thread of its own, bench/fake-api-worker.ts) and whose seed it renders
// before it answers.
//   node bench/webhook.ts [--rate 100] [--seconds 20] [--rounds 1]
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import pino from 'pino';
import { Pool } from 'undici';
import { serialMinter } from '../src/commands/cluster/webhook.ts';
import { startWebhookServer, WEBHOOK_PATH } from '../src/cluster/webhook/webhook-server.ts';
import { mutateVmi } from '../src/cluster/webhook/mutate.ts';
import { decideAdoption } from '../src/cluster/webhook/adopt.ts';
import { MemoryResolver } from '../src/cloudinit/refs/memory-resolver.ts';
import { readReview, reviewResponse } from '../src/cluster/webhook/review.ts';
import { testPki } from '../test/support/test-pki.ts';
import { Worker } from 'node:worker_threads';
import { KubeConnection } from '../src/kube/connection.ts';
import { clientPki } from '../test/support/webhook.ts';
import { KubeConnectionApi } from '../src/kube/api-client.ts';
import { KubeRefResolver } from '../src/kube/resolver.ts';
import type { SecretObject } from '../src/api/objects.ts';
import { quantile } from './stats.ts';

const { values } = parseArgs({
  options: {
    rate: { type: 'string', default: '100' },
    seconds: { type: 'string', default: '20' },
    rounds: { type: 'string', default: '1' },
  },
});
const rate = Number(values.rate);
const seconds = Number(values.seconds);
const rounds = Number(values.rounds);

const capk = JSON.parse(
  await readFile(new URL('../test/fixtures/adoption/capk-controlplane.json', import.meta.url), 'utf8'),
) as { vmi: { metadata: { annotations?: Record<string, string> } }; secrets: SecretObject[] };
const TOKEN = 'bench-webhook-token';
const fake = new Worker(new URL('./fake-api-worker.ts', import.meta.url), {
  workerData: { secrets: capk.secrets, token: TOKEN },
});
const { url, ca } = await new Promise<{ url: string; ca?: string }>((resolve, reject) => {
  fake.once('message', resolve);
  fake.once('error', reject);
});
const api = new KubeConnectionApi(new KubeConnection({ server: url, token: TOKEN, ...(ca ? { ca } : {}) }), {
  timeoutMs: 2000,
});

const pki = await testPki('bench-webhook');
const dir = await mkdtemp(join(tmpdir(), 'vmseed-bench-webhook-'));
await writeFile(join(dir, 'tls.crt'), pki.serverCert);
await writeFile(join(dir, 'tls.key'), pki.serverKey);
// The API server's client certificate, as --webhook-client-ca asks: its
// reviews may make the webhook read the Secrets they name.
const client = await clientPki('bench-webhook-client-ca', ['kube-apiserver']);
await writeFile(join(dir, 'client-ca.crt'), client.caCert);
const server = await startWebhookServer({
  listen: { host: '127.0.0.1', port: 0 },
  certDir: dir,
  logger: pino({ level: 'silent' }),
  mutate: { serials: serialMinter('http://169.254.169.254/v1', 'nocloud-net') },
  adoption: { secrets: new KubeRefResolver(api) },
  clientAuth: { caFile: join(dir, 'client-ca.crt') },
});
const review = JSON.parse(
  await readFile(new URL('../test/fixtures/webhook/vmi-from-vm.json', import.meta.url), 'utf8'),
) as { request: { uid: string; object?: unknown; namespace?: string } };
const adoptReview = {
  ...review,
  request: {
    ...review.request,
    namespace: 'capi-tenant',
    object: {
      ...capk.vmi,
      metadata: { ...capk.vmi.metadata, annotations: { ...capk.vmi.metadata.annotations, 'vmseed.io/adopt': 'true' } },
    },
  },
};
const pool = new Pool(`https://127.0.0.1:${server.address.port}`, {
  connections: 8,
  pipelining: 1,
  connect: { ca: pki.caCert, servername: 'localhost', ...client.clients['kube-apiserver'] },
});

async function run(secs: number, kind: Review): Promise<{ latencies: number[]; errors: number; wall: number }> {
  const template = kind === 'adopt' ? adoptReview : review;
  const total = Math.round(secs * rate);
  const latencies = new Array<number>(total);
  let errors = 0;
  let done = 0;
  let sent = 0;
  const start = performance.now();
  await new Promise<void>((resolveAll) => {
    const fire = (i: number) => {
      const due = start + (i * 1000) / rate;
      const body = JSON.stringify({ ...template, request: { ...template.request, uid: `bench-${i}` } });
      pool
        .request({ path: WEBHOOK_PATH, method: 'POST', body, headers: { 'content-type': 'application/json' } })
        .then(async (res) => {
          const answer = (await res.body.json()) as { response?: { uid?: string; patch?: string } };
          const patch = answer.response?.patch;
          const adopted = patch !== undefined && Buffer.from(patch, 'base64').toString().includes('vmseed.io~1adopted');
          if (
            res.statusCode !== 200 ||
            answer.response?.uid !== `bench-${i}` ||
            !patch ||
            adopted !== (kind === 'adopt')
          )
            errors++;
        })
        .catch(() => errors++)
        .finally(() => {
          latencies[i] = performance.now() - due;
          if (++done === total) resolveAll();
        });
    };
    const tick = () => {
      const due = Math.min(total, Math.floor(((performance.now() - start) * rate) / 1000) + 1);
      while (sent < due) fire(sent++);
      if (sent < total) setTimeout(tick, 1);
    };
    tick();
  });
  return { latencies, errors, wall: (performance.now() - start) / 1000 };
}

// One review's work without the network, 5,000 times.
function inProcess(): number[] {
  const mutate = { serials: serialMinter('http://169.254.169.254/v1', 'nocloud-net') };
  const out: number[] = [];
  for (let i = 0; i < 5000; i++) {
    const body = Buffer.from(JSON.stringify({ ...review, request: { ...review.request, uid: `p-${i}` } }));
    const t = performance.now();
    const read = readReview(body);
    if (read.kind === 'vmi-create') reviewResponse(read.review.uid, mutateVmi(read.review.object, mutate));
    out.push(performance.now() - t);
  }
  return out.sort((a, b) => a - b);
}

// One adoption decision without the network (the Secret from memory, the
// seed rendered), 2,000 times: what adoption adds to a review besides the
// Secret's read.
async function adoptionInProcess(): Promise<number[]> {
  const secrets = new MemoryResolver({ secrets: capk.secrets });
  const out: number[] = [];
  for (let i = 0; i < 2000; i++) {
    const t = performance.now();
    const d = await decideAdoption(adoptReview.request.object, 'annotation', { secrets });
    out.push(performance.now() - t);
    if (d.kind !== 'adopt') throw new Error('the bench VMI was not adopted');
  }
  return out.sort((a, b) => a - b);
}

type Review = 'plain' | 'adopt';

try {
  // Warm-up: TLS handshakes, JIT, the renderer's first use.
  await run(2, 'plain');
  await run(2, 'adopt');
  const all: Record<Review, { latencies: number[]; errors: number; sent: number }> = {
    plain: { latencies: [], errors: 0, sent: 0 },
    adopt: { latencies: [], errors: 0, sent: 0 },
  };
  for (let i = 0; i < rounds; i++)
    for (const kind of (i % 2 === 0 ? ['plain', 'adopt'] : ['adopt', 'plain']) as Review[]) {
      const r = await run(seconds, kind);
      all[kind].latencies.push(...r.latencies);
      all[kind].errors += r.errors;
      all[kind].sent += r.latencies.length;
    }
  const work = inProcess();
  const adoptWork = await adoptionInProcess();
  const ms = (v: number) => `${v.toFixed(2)} ms`;
  const rowOf = (kind: Review, what: string) => {
    const sorted = [...all[kind].latencies].sort((a, b) => a - b);
    return `| ${what} | ${sorted.length} | ${ms(quantile(sorted, 0.5))} | ${ms(quantile(sorted, 0.99))} | ${ms(sorted.at(-1)!)} | ${all[kind].errors} |`;
  };
  const p99 = (kind: Review) =>
    quantile(
      [...all[kind].latencies].sort((a, b) => a - b),
      0.99,
    );
  process.stdout.write(
    [
      `webhook on loopback HTTPS, ${rate} AdmissionReviews/s, ${rounds} alternated round(s) of ${seconds} s each (open loop)`,
      '| review | sent | median | p99 | max | errors |',
      '|---|---|---|---|---|---|',
      rowOf('plain', 'gate and serial (no adoption)'),
      rowOf('adopt', 'CAPK VMI adopted (Secret read over HTTPS, seed rendered)'),
      `p99 with adoption ÷ without: ${(p99('adopt') / p99('plain')).toFixed(2)}×`,
      '',
      `one review's work in process (parse, patch, answer; ${work.length} times): median ${ms(quantile(work, 0.5))}, p99 ${ms(quantile(work, 0.99))}`,
      `one adoption decision in process (the Secret from memory, the seed rendered; ${adoptWork.length} times): median ${ms(quantile(adoptWork, 0.5))}, p99 ${ms(quantile(adoptWork, 0.99))}`,
      '',
    ].join('\n'),
  );
} finally {
  await pool.close();
  await server.close();

  fake.postMessage('stop');
  await new Promise((resolve) => fake.once('exit', resolve));
  await rm(dir, { recursive: true, force: true });
}
