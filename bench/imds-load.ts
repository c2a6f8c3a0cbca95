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
  // Due but not sent: every connection was waiting for an answer (only
  // with maxInFlight).
  notSent: number;
  wallSeconds: number;
  latenciesMs: Float64Array;
}

// Requests are due at a fixed rate whatever the answers do (open loop); each
// latency is measured from the moment the request was due.
// `from`: a local source address and pool size (a guest beside a flood).
// `maxInFlight`: a client that sends only on a free connection, as a flood
// tool on a fixed number of connections does (wrk, hey -c); a request due
// while every connection waits for an answer is dropped, not queued.
// Without it, requests queue in the client without bound.
export async function load(
  name: string,
  origin: string,
  paths: string[],
  secs: number,
  rate: number,
  from?: { localAddress: string; connections: number },
  headers?: Record<string, string>,
  maxInFlight?: number,
  // The identity rows: the source address of each path (by its index), a
  // pool of `connections` per address, as each launcher pod has its own IP.
  sources?: { of: (pathIndex: number) => string; connections: number },
): Promise<Result> {
  const pool = new Pool(origin, {
    connections: from?.connections ?? 64,
    pipelining: 1,
    ...(from ? { localAddress: from.localAddress } : {}),
  });
  const pools = new Map<string, Pool>();
  const poolOf = (pathIndex: number): Pool => {
    if (sources === undefined) return pool;
    const address = sources.of(pathIndex);
    let p = pools.get(address);
    if (p === undefined) {
      p = new Pool(origin, { connections: sources.connections, pipelining: 1, localAddress: address });
      pools.set(address, p);
    }
    return p;
  };
  const total = Math.round(secs * rate);
  const latencies = new Float64Array(total);
  let sent = 0;
  let ok = 0;
  let errors = 0;
  let limited = 0;
  let notSent = 0;
  let inFlight = 0;
  let done = 0;
  let measured = 0;
  const start = performance.now();
  let onFree = () => {};
  await new Promise<void>((resolveAll) => {
    const fire = (i: number) => {
      const due = start + (i * 1000) / rate;
      if (maxInFlight !== undefined && inFlight >= maxInFlight) {
        notSent++;
        if (++done === total) resolveAll();
        return;
      }
      inFlight++;
      poolOf(i % paths.length)
        .request({ path: paths[i % paths.length], method: 'GET', ...(headers ? { headers } : {}) })
        .then(async (res) => {
          await res.body.arrayBuffer();
          if (res.statusCode === 200) ok++;
          else if (res.statusCode === 429) limited++;
          else errors++;
        })
        .catch(() => errors++)
        .finally(() => {
          inFlight--;
          latencies[measured++] = performance.now() - due;
          if (++done === total) resolveAll();
          else onFree();
        });
    };
    // The generator wakes only when a request falls due, not on a fixed
    // tick: its own wake-ups take CPU the server under test would have had,
    // more so for a slow sender (VM 0 at its allowance) on a fixed 1 ms tick.
    // A flood tool whose every connection waits does not wake at all: what
    // fell due meanwhile is counted as not sent when a connection frees.
    let timer: NodeJS.Timeout | undefined;
    const tick = () => {
      timer = undefined;
      const due = Math.min(total, Math.floor(((performance.now() - start) * rate) / 1000) + 1);
      while (sent < due) fire(sent++);
      if (sent >= total || (maxInFlight !== undefined && inFlight >= maxInFlight)) return;
      const next = start + (sent * 1000) / rate;
      timer = setTimeout(tick, Math.max(1, next - performance.now()));
    };
    onFree = () => {
      if (timer === undefined && sent < total) tick();
    };
    tick();
  });
  const wallSeconds = (performance.now() - start) / 1000;
  await pool.close();
  await Promise.all([...pools.values()].map((p) => p.close()));
  return {
    name,
    sent: sent - notSent,
    ok,
    errors,
    limited,
    notSent,
    wallSeconds,
    latenciesMs: latencies.subarray(0, measured),
  };
}
