// Whether the DNAT target is this node's datasource, not only whether the
// rule exists: a rule pointing at a wrong port hands guests' requests (their
// tokens in the path) to whatever listens there. The check sends the
// datasource challenge (src/redirect/challenge.ts) to the target the rule
// rewrites to, from the node: the sidecar's own packets never cross a pod
// interface, so it cannot go through the rule itself; the keeper has already
// verified that the rule listed in nftables DNATs to exactly this address.
import { request } from 'node:http';
import { answerMatches, CHALLENGE_PREFIX, newNonce } from './challenge.ts';

// The datasource answers a few lines of 43 characters.
const BODY_MAX = 4096;

// wrong-target: something answered, not with the proof (another service);
// target-unreachable: nothing answered; target-unverified: the keys to check
// the answer with could not be read.
export type TargetVerdict =
  { ok: true } | { ok: false; reason: 'wrong-target' | 'target-unreachable' | 'target-unverified'; message: string };

export interface HttpAnswer {
  // 0: no answer (refused, reset, timed out).
  status: number;
  body: string;
  error?: string;
}

export interface TargetCheckOptions {
  to: { host: string; port: number };
  // The datasource keys, read at each check (the Secret may rotate).
  keys: () => Promise<readonly Uint8Array[]>;
  timeoutMs?: number;
  // How the challenge travels (tests: from inside a network namespace).
  get?: (url: string, timeoutMs: number) => Promise<HttpAnswer>;
}

export function httpGet(url: string, timeoutMs: number): Promise<HttpAnswer> {
  return new Promise((resolve) => {
    const req = request(url, { agent: false, timeout: timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        if (size < BODY_MAX) chunks.push(c.subarray(0, BODY_MAX - size));
        size += c.length;
        if (size >= BODY_MAX) res.destroy();
      });
      const done = () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') });
      res.on('end', done);
      res.on('close', done);
      res.on('error', done);
    });
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on('error', (e: NodeJS.ErrnoException) => resolve({ status: 0, body: '', error: e.code ?? e.message }));
    req.end();
  });
}

/**
 * A check that the redirect's target answers the datasource challenge with one
 * of our keys; unreadable keys or no answer come back as the verdict's reason.
 */
export function targetChecker(o: TargetCheckOptions): () => Promise<TargetVerdict> {
  const target = `${o.to.host}:${o.to.port}`;
  const get = o.get ?? httpGet;
  const timeoutMs = o.timeoutMs ?? 2000;
  return async () => {
    let keys: readonly Uint8Array[];
    try {
      keys = await o.keys();
    } catch (e) {
      return {
        ok: false,
        reason: 'target-unverified',
        message: `cannot read the datasource keys: ${(e as Error).message}`,
      };
    }
    const nonce = newNonce();
    const a = await get(`http://${target}${CHALLENGE_PREFIX}${nonce}`, timeoutMs);
    if (a.status === 0)
      return {
        ok: false,
        reason: 'target-unreachable',
        message: `nothing answers at the DNAT target ${target} (${a.error ?? 'no answer'}); is the agent's datasource listening there (--datasource-listen)?`,
      };
    if (a.status === 200 && answerMatches(keys, nonce, a.body)) return { ok: true };
    return {
      ok: false,
      reason: 'wrong-target',
      message: `the DNAT target ${target} is not this node's datasource (HTTP ${a.status}, no valid answer to the challenge); guests' requests would go to another service: check --to against the agent's --datasource-listen`,
    };
  };
}
