// The node side of bench/provisioning-events.ts, in a worker thread (an
// event loop of its own, apart from the simulated guests'): the datasource
// listener over 50 VMIs with the agent's ProvisioningTracker behind its
// progress receiver. It stamps (performance.timeOrigin + now, comparable
// across threads) when each VMI's ProvisioningSucceeded Event is recorded
// and when its status first reads "succeeded".
import { parentPort, workerData } from 'node:worker_threads';
import pino from 'pino';
import type { Seed } from '../src/cloudinit/seed.ts';
import type { VmiObject } from '../src/api/objects.ts';
import { createMetrics } from '../src/metrics/metrics.ts';
import { startDatasourceServer } from '../src/datasource/server.ts';
import type { SeedDirectory, SeedDirectoryEntry } from '../src/datasource/types.ts';
import { DatasourceKeyring } from '../src/datasource/tokens.ts';
import type { EventRecorder } from '../src/agent/events.ts';
import { ProvisioningTracker } from '../src/agent/provisioning/tracker.ts';
import { VmiRecords } from '../src/agent/vmi-records.ts';
import { threadUsage } from './thread-usage.ts';
import { benchDirectory } from './imds-directory.ts';

// launchers: the identity rows (imds-directory.ts): the agent's own
// directory with the launcher pods known (true: VM i's at 127.0.0.<10+i>,
// where the bench sends from) or not (false); absent: the plain directory.
const { key, vmis, launchers } = workerData as { key: Uint8Array; vmis: number; launchers?: boolean };
const wall = () => performance.timeOrigin + performance.now();

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

const entries = new Map<string, SeedDirectoryEntry>();
const objects = new Map<string, VmiObject>();
const records = new VmiRecords();
for (let i = 0; i < vmis; i++) {
  const uid = `uid-${i}`;
  entries.set(uid, { namespace: 'bench', name: `vm-${i}`, uid, seed: seedOf(i) });
  objects.set(`bench/vm-${i}`, { metadata: { namespace: 'bench', name: `vm-${i}`, uid }, spec: {} });
  const r = records.of(`bench/vm-${i}`);
  r.status = { namespace: 'bench', name: `vm-${i}`, uid, state: 'ready', warnings: [], retries: 0 };
  r.firstSeen = { uid, at: Date.now(), reported: true };
}
const directory: SeedDirectory =
  launchers !== undefined
    ? benchDirectory(vmis, seedOf, launchers, (i) => `127.0.0.${10 + i}`)
    : {
        revision: 1,
        get: (uid) => entries.get(uid),
        listUids: () => entries.keys(),
        byAddress: () => undefined,
        recordFetch: () => {},
      };

const eventAt = new Map<string, number>();
const statusAt = new Map<string, number>();
const recorder: EventRecorder = {
  record(vmi, _type, reason) {
    if (reason === 'ProvisioningSucceeded' || reason === 'ProvisioningFailed') eventAt.set(vmi.metadata.name, wall());
  },
  flush: async () => {},
};
const metrics = createMetrics({ version: 'bench', processMetrics: false });
const tracker = new ProvisioningTracker({
  records,
  vmiOf: (k) => objects.get(k),
  events: recorder,
  metrics,
  logger: pino({ level: 'silent' }),
});
// What the status page reads, checked right after the final event (only
// then: building it for every event would be the bench's cost, not the agent's).
const sink = {
  report: (...args: Parameters<ProvisioningTracker['report']>) => {
    const kept = tracker.report(...args);
    const name = args[0].name;
    const final = args[1].name === 'modules-final' && args[1].type === 'finish';
    if (
      final &&
      !statusAt.has(name) &&
      tracker.status(records.get(`bench/${name}`)!, Date.now())?.state === 'succeeded'
    )
      statusAt.set(name, wall());
    return kept;
  },
};
const server = await startDatasourceServer({
  listen: { host: '127.0.0.1', port: 0 },
  directory,
  keyring: new DatasourceKeyring([key]),
  logger: pino({ level: 'silent' }),
  metrics,
  reports: { sink },
});
const usage = threadUsage();
async function collect(): Promise<void> {
  // Events the receiver took, so far (a counter).
  const accepted = (await metrics.provisioningReports.get()).values.reduce((n, v) => n + v.value, 0);
  parentPort!.postMessage({
    eventAt: Object.fromEntries(eventAt),
    statusAt: Object.fromEntries(statusAt),
    accepted,
    ...usage(),
  });
  eventAt.clear();
  statusAt.clear();
}
parentPort!.on('message', (m: string) => {
  if (m === 'collect') void collect();
});
parentPort!.postMessage({ port: server.address.port });
