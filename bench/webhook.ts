// bench:webhook: AdmissionReviews of a VMI (the KubeVirt-shaped one of the
// tests, its serial minted) sent at a fixed rate to the admission webhook
// over loopback HTTPS (keep-alive connections, as the API server keeps
// them), open loop: each latency counts from when the request was due.
// Prints the median, p99 and max, and the errors (any answer other than
// 200 with a patch); and, to tell the webhook's own work from the machine's
// load, the same percentiles of parsing, patching and answering one review
// in process, without the network.
//   node bench/webhook.ts [--rate 100] [--seconds 20]
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import pino from 'pino';
import { Pool } from 'undici';
import { serialMinter } from '../src/commands/cluster/webhook.ts';
import { startWebhookServer, WEBHOOK_PATH } from '../src/cluster/webhook/webhook-server.ts';
import { mutateVmi } from '../src/cluster/webhook/mutate.ts';
import { readReview, reviewResponse } from '../src/cluster/webhook/review.ts';
import { testPki } from '../test/support/test-pki.ts';
import { quantile } from './stats.ts';

const { values } = parseArgs({
  options: { rate: { type: 'string', default: '100' }, seconds: { type: 'string', default: '20' } },
});
const rate = Number(values.rate);
const seconds = Number(values.seconds);

const pki = await testPki('bench-webhook');
const dir = await mkdtemp(join(tmpdir(), 'vmseed-bench-webhook-'));
await writeFile(join(dir, 'tls.crt'), pki.serverCert);
await writeFile(join(dir, 'tls.key'), pki.serverKey);
const server = await startWebhookServer({
  listen: { host: '127.0.0.1', port: 0 },
  certDir: dir,
  logger: pino({ level: 'silent' }),
  mutate: { serials: serialMinter('http://169.254.169.254/v1', 'nocloud-net') },
});
const review = JSON.parse(
  await readFile(new URL('../test/fixtures/webhook/vmi-from-vm.json', import.meta.url), 'utf8'),
) as { request: { uid: string } };
const pool = new Pool(`https://127.0.0.1:${server.address.port}`, {
  connections: 8,
  pipelining: 1,
  connect: { ca: pki.caCert, servername: 'localhost' },
});

async function run(secs: number): Promise<{ latencies: number[]; errors: number; wall: number }> {
  const total = Math.round(secs * rate);
  const latencies = new Array<number>(total);
  let errors = 0;
  let done = 0;
  let sent = 0;
  const start = performance.now();
  await new Promise<void>((resolveAll) => {
    const fire = (i: number) => {
      const due = start + (i * 1000) / rate;
      const body = JSON.stringify({ ...review, request: { ...review.request, uid: `bench-${i}` } });
      pool
        .request({ path: WEBHOOK_PATH, method: 'POST', body, headers: { 'content-type': 'application/json' } })
        .then(async (res) => {
          const answer = (await res.body.json()) as { response?: { uid?: string; patch?: string } };
          if (res.statusCode !== 200 || answer.response?.uid !== `bench-${i}` || !answer.response.patch) errors++;
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

try {
  await run(2); // warm-up: TLS handshakes, JIT
  const r = await run(seconds);
  const work = inProcess();
  const sorted = [...r.latencies].sort((a, b) => a - b);
  const ms = (v: number) => `${v.toFixed(2)} ms`;
  process.stdout.write(
    [
      `webhook on loopback HTTPS, ${rate} AdmissionReviews/s for ${seconds} s (open loop, ${sorted.length} sent in ${r.wall.toFixed(1)} s)`,
      '| median | p99 | max | errors |',
      '|---|---|---|---|',
      `| ${ms(quantile(sorted, 0.5))} | ${ms(quantile(sorted, 0.99))} | ${ms(sorted.at(-1)!)} | ${r.errors} |`,
      '',
      `one review's work in process (parse, patch, answer; ${work.length} times): median ${ms(quantile(work, 0.5))}, p99 ${ms(quantile(work, 0.99))}`,
      '',
    ].join('\n'),
  );
} finally {
  await pool.close();
  await server.close();
  await rm(dir, { recursive: true, force: true });
}
