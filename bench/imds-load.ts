// The open-loop load of bench:imds, shared by the loopback run and the
// runs inside network namespaces (bench/imds-load-cli.ts).
import { Pool } from 'undici';

export interface Result {
  name: string;
  sent: number;
  ok: number;
  errors: number;
  // 429 answers (the IMDS rows' rate limit), not counted as errors.
  limited: number;
  wallSeconds: number;
  latenciesMs: Float64Array;
}

// Requests are due at a fixed rate whatever the answers do (open loop); each
// latency is measured from the moment the request was due.
// `from`: a local source address and pool size (a guest beside a flood).
export async function load(
  name: string,
  origin: string,
  paths: string[],
  secs: number,
  rate: number,
  from?: { localAddress: string; connections: number },
  headers?: Record<string, string>,
): Promise<Result> {
  const pool = new Pool(origin, {
    connections: from?.connections ?? 64,
    pipelining: 1,
    ...(from ? { localAddress: from.localAddress } : {}),
  });
  const total = Math.round(secs * rate);
  const latencies = new Float64Array(total);
  let sent = 0;
  let ok = 0;
  let errors = 0;
  let limited = 0;
  let done = 0;
  const start = performance.now();
  await new Promise<void>((resolveAll) => {
    const fire = (i: number) => {
      const due = start + (i * 1000) / rate;
      pool
        .request({ path: paths[i % paths.length], method: 'GET', ...(headers ? { headers } : {}) })
        .then(async (res) => {
          await res.body.arrayBuffer();
          if (res.statusCode === 200) ok++;
          else if (res.statusCode === 429) limited++;
          else errors++;
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
  const wallSeconds = (performance.now() - start) / 1000;
  await pool.close();
  return { name, sent, ok, errors, limited, wallSeconds, latenciesMs: latencies };
}
