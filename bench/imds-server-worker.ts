// Runs in a worker thread so the server under test has its own event loop,
// apart from the load generator's. `kind` picks vmseed's datasource or a
// bare node:http server answering a fixed body (the reference floor), or
// answering every request 429 as a rate limiter would, with nothing else
// (where a flood goes in the flood's reference row).
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { parentPort, workerData } from 'node:worker_threads';
import pino from 'pino';
import type { Seed } from '../src/cloudinit/seed.ts';
import { createMetrics } from '../src/metrics/metrics.ts';
import { startDatasourceServer, type SeedDirectory, type SeedDirectoryEntry } from '../src/http/datasource.ts';
import { DatasourceKeyring } from '../src/http/datasource-tokens.ts';
import { launcherTokenReader } from '../src/agent/launcher-token.ts';
import { podUid } from './imds-pods.ts';

const { kind, key, vmis, perSourceCap, podsDir } = workerData as {
  kind: 'vmseed' | 'bare' | 'bare-429';
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
  const directory: SeedDirectory = {
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
