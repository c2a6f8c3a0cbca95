// Runs in a worker thread so the server under test has its own event loop,
// apart from the load generator's. `kind` picks vmseed's datasource or a
// bare node:http server answering a fixed body (the reference floor), or
// answering every request 429 as a rate limiter would, with nothing else
// (where a flood goes in the flood's reference row), or the least server
// that keeps IMDS's contract on the identity and token paths (bare-imds:
// the reference the IMDS flood rows run against too).
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { parentPort, workerData } from 'node:worker_threads';
import pino from 'pino';
import type { Seed } from '../src/cloudinit/seed.ts';
import { createMetrics } from '../src/metrics/metrics.ts';
import { startDatasourceServer } from '../src/datasource/server.ts';
import type { SeedDirectory, SeedDirectoryEntry } from '../src/datasource/types.ts';
import { DatasourceKeyring } from '../src/datasource/tokens.ts';
import { launcherTokenReader } from '../src/agent/domain/launcher-token.ts';
import { podUid } from './imds-pods.ts';
import { benchDirectory } from './imds-directory.ts';
import { jwt } from '../test/datasource/imds-support.ts';
import { holdConnection } from '../src/datasource/flood/connection-hold.ts';
import { RateLimiter } from '../src/datasource/flood/rate-limit.ts';
import { IMDS_GUARD_DEFAULTS, RETRY_AFTER_MS } from '../src/datasource/imds/guards.ts';

const { kind, key, vmis, perSourceCap, podsDir, launchers } = workerData as {
  kind: 'vmseed' | 'bare' | 'bare-429' | 'bare-imds';
  // The identity rows: the agent's AgentSeedDirectory (imds-directory.ts),
  // with the launcher pods known (true) or not (false); absent: the plain
  // directory of the other rows.
  launchers?: boolean;
  key: Uint8Array;
  vmis: number;
  perSourceCap?: boolean;
  // The IMDS rows: every VMI opted in, its token read from this pods tree
  // (pod UIDs from podUid(i)).
  podsDir?: string;
};

// The server thread's CPU time so far, on request: what answering a flood
// costs, apart from the wall-clock latency a loaded machine stretches.
parentPort!.on('message', (m: unknown) => {
  if (m === 'cpu') parentPort!.postMessage({ cpu: process.threadCpuUsage() });
});

function seedOf(i: number): Seed {
  const enc = new TextEncoder();
  return {
    datasource: 'nocloud',
    metaData: { 'instance-id': `iid-${i}`, 'local-hostname': `vm-${i}` },
    userData: enc.encode(`#cloud-config\nhostname: vm-${i}\npackages: [nginx]\nruncmd:\n  - echo hello ${i}\n`),
    vendorData: enc.encode('#cloud-config\n{}\n'),
    networkConfig: enc.encode('version: 2\nethernets:\n  eth0:\n    dhcp4: true\n'),
    warnings: [],
  };
}

if (kind === 'vmseed') {
  const entries = new Map<string, SeedDirectoryEntry>();
  for (let i = 0; i < vmis; i++)
    entries.set(`uid-${i}`, {
      namespace: 'bench',
      name: `vm-${i}`,
      uid: `uid-${i}`,
      seed: seedOf(i),
      imds: { enabled: true, serviceAccountName: 'sa', serviceAccountToken: true, launcherPods: [podUid(i)] },
    });
  const lastFetch = new Map<string, Date>();
  const directory: SeedDirectory =
    launchers !== undefined
      ? benchDirectory(vmis, seedOf, launchers)
      : {
          revision: 1,
          get: (uid) => entries.get(uid),
          listUids: () => entries.keys(),
          byAddress: () => undefined,
          recordFetch: (ns, name, file, at) => void lastFetch.set(`${ns}/${name}/${file}`, at),
        };
  const server = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory,
    keyring: new DatasourceKeyring([key]),
    logger: pino({ level: 'silent' }),
    metrics: createMetrics({ version: 'bench', processMetrics: false }),
    // One loopback client stands for every guest here, so the per-source
    // rate limit is lifted (the limiter still runs on every request), and so
    // is the per-source connection cap unless the flood row asks for it.
    limits: { ratePerSecond: 1e9, burst: 1e9, ...(perSourceCap ? {} : { maxConnectionsPerSource: 1e9 }) },
    // IMDS's own guards stay at their defaults: per VMI, as in production.
    ...(podsDir ? { readServiceAccountToken: launcherTokenReader(podsDir) } : {}),
  });
  parentPort!.postMessage({ port: server.address.port });
} else if (kind === 'bare-imds') {
  // `Metadata: true` required, a token bucket per VM (by the path's token)
  // at IMDS's rate and burst, a refusal answered 429 with Retry-After and
  // its connection not read for as long as vmseed holds one, and fixed
  // answers: what any server keeping that contract must do, and no more.
  const identity = JSON.stringify({ namespace: 'bench', serviceAccountName: 'sa', vmName: 'vm-0' });
  const exp = Math.floor(Date.now() / 1000) + 3600;
  const token = JSON.stringify({
    token: jwt({ exp, sub: 'vm-0' }),
    expirationTimestamp: new Date(exp * 1000).toISOString(),
  });
  const { ratePerSecond, burst } = IMDS_GUARD_DEFAULTS;
  const perVm = new RateLimiter({ ratePerSecond, burst });
  const server = createServer((req, res) => {
    const parts = (req.url ?? '').split('/');
    const send = (status: number, body: string, extra: Record<string, string> = {}) => {
      res.writeHead(status, {
        'Content-Type': 'application/json',
        'Content-Length': String(Buffer.byteLength(body)),
        'Cache-Control': 'no-store',
        ...extra,
      });
      res.end(body);
    };
    if (req.headers.metadata !== 'true') return send(400, '{}');
    if (!perVm.take(parts[2] ?? '')) {
      send(429, '{}', { 'Retry-After': String(RETRY_AFTER_MS / 1000) });
      holdConnection(req, res, RETRY_AFTER_MS);
      return;
    }
    send(200, parts[3] === 'token' ? token : identity);
  });
  server.keepAliveTimeout = 5000;
  server.listen(0, '127.0.0.1', () => parentPort!.postMessage({ port: (server.address() as AddressInfo).port }));
} else if (kind === 'bare-429') {
  const body = 'too many requests\n';
  const server = createServer((_req, res) => {
    res.writeHead(429, {
      'Content-Type': 'text/plain',
      'Content-Length': String(body.length),
      'Retry-After': '1',
      'Cache-Control': 'no-store',
    });
    res.end(body);
  });
  server.keepAliveTimeout = 5000;
  server.listen(0, '127.0.0.1', () => parentPort!.postMessage({ port: (server.address() as AddressInfo).port }));
} else {
  const body = seedOf(0).userData;
  const server = createServer((_req, res) => {
    res.writeHead(200, {
      'Content-Type': 'application/octet-stream',
      'Content-Length': String(body.byteLength),
      'Cache-Control': 'no-store',
    });
    res.end(body);
  });
  server.keepAliveTimeout = 5000;
  server.listen(0, '127.0.0.1', () => parentPort!.postMessage({ port: (server.address() as AddressInfo).port }));
}
