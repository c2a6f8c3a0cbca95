// A VMI's state is its record plus the per-VMI tables registered beside it
// (VmiRecords.register); the reconciler's end(key) drops all of it. Two
// proofs that nothing of a deleted VMI stays:
// - every Map and Set field of the agent's long-lived parts is classified,
//   either as the registered table that holds it or with why it is not
//   per-VMI state, and the tables an agent with every part on registers are
//   exactly the classified ones: a new table cannot go unregistered unseen;
// - two VMIs driven as far as the fakes go (one waiting for its domain to
//   start, one attached, polled for its first read and annotated) hold
//   something in every registered table when they are deleted, and nothing
//   in any of them afterwards.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { clientDomainEvents } from '../../src/agent/domain/waits.ts';
import { LibvirtInjector } from '../../src/libvirt/injector.ts';
import type { SecretObject } from '../../src/api/objects.ts';
import { fakeKubeAndDir, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { EventingFakeClient, FakeLibvirt, type FakeDomain } from '../support/fake-libvirt.ts';
import { FakeClient } from '../support/seed-read-doubles.ts';

const SRC = new URL('../../src/', import.meta.url).pathname;

// Where per-VMI state can live: the parts that outlive one reconcile.
const SCANNED = ['agent', 'datasource', 'libvirt', 'kube', 'disk', 'core'];

// Each Map/Set field found: { table } is the name its holder registers
// under (the record itself is 'record'); { not } says why it is not state
// of one VMI that must end with it.
type Class = { table: string } | { not: string };
const FIELDS: Record<string, Class> = {
  'agent/vmi-records.ts #byKey': { table: 'record' },
  'agent/vmi-records.ts #tables': { not: 'the registry of the per-VMI tables' },
  'agent/work-queue.ts #failures': { table: 'queue' },
  'agent/work-queue.ts #timers': { table: 'queue' },
  'agent/work-queue.ts #parked': { table: 'queue' },
  'agent/work-queue.ts #parkTimers': { table: 'queue' },
  'agent/work-queue.ts #queued': { not: 'work waiting to run: a key added again must run' },
  'agent/work-queue.ts #running': { not: 'runs in flight (the ending reconcile is one), gone when each ends' },
  'agent/work-queue.ts #runningRetries': { not: 'runs in flight, gone when each ends' },
  'agent/work-queue.ts #dirty': { not: 'adds during a run, run after it' },
  'agent/events.ts #seen': { table: 'events' },
  'agent/events.ts #busy': { not: 'Event aggregates being sent (at most two)' },
  'agent/events.ts #sending': { not: 'Events being sent (at most two)' },
  'agent/controller.ts #held': { not: 'keys seen before start-up garbage collection, emptied by start()' },
  'agent/schema-warmup.ts #pending': {
    not: "keys whose check waits for their release's warm-up, emptied when it runs",
  },
  'agent/schema-warmup.ts keys': { not: "one release's entry of #pending" },
  'agent/schema-warmup.ts #tried': { not: 'releases warmed up, at most two' },
  'agent/domain/waits.ts #byKey': { table: 'domain-waits' },
  'agent/domain/waits.ts #byDomain': { table: 'domain-waits' },
  'agent/domain/seed-read.ts #polls': { table: 'seed-reads' },
  'agent/domain/seed-read.ts #starts': { not: "libvirt's start events per domain, bounded, dropped when it stops" },
  'agent/domain/launcher-token.ts #byPod': { not: "a launcher pod's token volume name, bounded" },
  'agent/provisioning/annotation-writer.ts #keys': { table: 'annotations' },
  'agent/provisioning/annotation-writer.ts #waiting': { table: 'annotations' },
  'agent/provisioning/annotation-writer.ts #inFlight': { not: 'writes in flight' },
  'agent/provisioning/tracker.ts #evented': { not: 'a WeakMap keyed by the record: it goes with the record' },
  'agent/ref-dependencies.ts #changes': { table: 'ref-dependencies' },
  'agent/ref-dependencies.ts #lastEnqueue': { table: 'ref-dependencies' },
  'agent/ref-dependencies.ts #timers': { table: 'ref-dependencies' },
  'agent/ref-dependencies.ts #sessions': { not: 'the reconcile in flight, gone when it ends' },
  'agent/reconcile-signals.ts #inFlight': { not: 'the reconcile in flight, gone when it ends' },
  'agent/render-pool.ts #slots': { not: 'render workers' },
  'agent/local/settle.ts #entries': { not: 'manifest files settling' },
  'agent/local/local-vmi-source.ts #files': { not: 'manifest files: they follow the directory' },
  'agent/local/local-vmi-source.ts #pendingRemoval': { not: 'manifest files: they follow the directory' },
  'agent/local/local-vmi-source.ts #fileErrors': { not: 'manifest files: they follow the directory' },
  'agent/local/local-vmi-source.ts #dirs': { not: 'manifest directories' },
  'agent/local/local-vmi-source.ts #newDirs': { not: 'manifest directories' },
  'agent/local/local-vmi-source.ts #vmis': { not: 'the source: where a deletion comes from' },
  'agent/local/local-vmi-source.ts #secrets': { not: 'the source' },
  'agent/local/local-vmi-source.ts #configMaps': { not: 'the source' },
  'kube/list-watch.ts #objects': { not: "the informer's cache: where a deletion comes from" },
  'kube/kube-vmi-source.ts #byScope': { not: 'informers per namespace scope' },
  'kube/object-watches.ts #uses': { table: 'ref-dependencies' },
  'kube/object-watches.ts users': { table: 'ref-dependencies' },
  'kube/object-watches.ts pins': { not: 'readers of reconciles in flight, released when each ends' },
  'kube/object-watches.ts #entries': { not: 'referenced objects, dropped once no VMI holds them' },
  'datasource/directory.ts #byUid': { table: 'seeds' },
  'datasource/directory.ts #uidByKey': { table: 'seeds' },
  'datasource/directory.ts #byLauncherAddress': {
    not: "launcher addresses, rebuilt from the held VMIs and the node's pods when either moves",
  },
  'datasource/reports/receiver.ts #inFlightPerVm': {
    not: 'bodies being read, each entry gone when its last body ends',
  },
  'kube/node-pods.ts #byUid': { not: "this node's pods as the API lists them: a pod's deletion removes it" },
  'kube/node-pods.ts #uidByName': { not: "this node's pods as the API lists them: a pod's deletion removes it" },
  'kube/node-pods.ts #timers': { not: 'watch restarts backing off' },
  'datasource/identity.ts #byToken': { not: "rebuilt from the seed directory at the directory's next revision" },
  'datasource/imds/sessions.ts #byKey': {
    not: "IMDS sessions: bounded per VMI and per node, expiring, dropped at the first sweep after the directory's revision moves once their VMI is gone",
  },
  'datasource/imds/sessions.ts #byVmi': { not: 'the same sessions by VMI, dropped with them' },
  'datasource/early.ts #misses': { not: 'hashes of tokens that verified nothing yet: bounded, expiring' },
  'datasource/early.ts #perSource': { not: 'per source address, bounded' },
  'datasource/flood/rate-limit.ts #buckets': { not: 'per source address' },
  'datasource/bytes.ts #metaDataCache': { not: 'a WeakMap keyed by the Seed' },
  'datasource/openstack-paths.ts #views': { not: 'a WeakMap keyed by the Seed' },
  'libvirt/prepared-attach.ts #prepared': { table: 'injector' },
  'libvirt/prepared-attach.ts #sent': { table: 'injector' },
  'libvirt/prepared-attach.ts #sending': { not: 'attaches in flight until libvirt answers' },
  'libvirt/domain-lock.ts #tails': { not: "per-domain turns, each gone when the domain's last change ends" },
  'libvirt/injector.ts #pending': { not: 'one detach waiting for its events' },
  'libvirt/domain-devices.ts #children': { not: 'one parse' },
  'libvirt/disk-xml.ts #seen': { not: 'one parse' },
  'libvirt/rpc/remote.ts #domains': { not: "libvirt's handles by domain name, following its events, bounded" },
  'libvirt/rpc/remote.ts #events': { not: 'libvirt events waiting for delivery' },
  'libvirt/rpc/manager.ts #entries': { not: 'connections per libvirt URI' },
  'libvirt/rpc/manager.ts #listeners': { not: 'event listeners' },
  'libvirt/rpc/manager.ts #sleepers': { not: 'calls backing off' },
  'libvirt/rpc/rpc-connection.ts #pending': { not: 'calls in flight' },
  'libvirt/rpc/rpc-connection.ts #outstanding': { not: 'calls in flight' },
  'libvirt/rpc/rpc-connection.ts #pongWaiters': { not: 'keepalives in flight' },
  'disk/store.ts #dirs': { not: "the files' directories, dropped by remove() with them, bounded" },
  'disk/store.ts #last': { not: 'what each image file holds, dropped by remove() with it, bounded' },
  'core/log-throttle.ts #windows': { not: 'per kind of log line' },
};

// Tables whose per-VMI state is the record's, registered for what they
// derive from it (the status store's gauges).
const DERIVED_TABLES = ['status'];

const MODIFIERS = String.raw`(?:(?:readonly|private|protected|public|static|declare)\s+)*`;
// `#x = new Map()`, `readonly x: Map<..> = new Map()`, and typed fields set
// in the constructor (`readonly #x: Set<string>;`).
const INITIALISED = new RegExp(
  String.raw`^\s+${MODIFIERS}(#?[A-Za-z_$][\w$]*)\s*(?::[^=;]*)?=\s*new\s+(?:Weak)?(?:Map|Set)\b`,
);
const DECLARED = new RegExp(
  String.raw`^\s+(?:readonly\s+)?(#[\w$]+|(?<=readonly\s+)[\w$]+)\s*:[^=;]*\b(?:Weak)?(?:Map|Set)<`,
);

function mapAndSetFields(): string[] {
  const found = new Set<string>();
  const walk = (dir: string) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, e.name);
      if (e.isDirectory()) walk(path);
      else if (path.endsWith('.ts'))
        for (const line of readFileSync(path, 'utf8').split('\n')) {
          const m = INITIALISED.exec(line) ?? DECLARED.exec(line);
          if (m) found.add(`${relative(SRC, path)} ${m[1]}`);
        }
    }
  };
  for (const d of SCANNED) walk(join(SRC, d));
  return [...found].sort();
}

function classifiedTables(): string[] {
  const names = Object.values(FIELDS).flatMap((c) => ('table' in c && c.table !== 'record' ? [c.table] : []));
  return [...new Set([...names, ...DERIVED_TABLES])].sort();
}

test('every Map and Set field of the parts that outlive a reconcile is classified: per-VMI (and registered) or not', () => {
  const found = mapAndSetFields();
  const unclassified = found.filter((f) => !(f in FIELDS));
  assert.deepEqual(
    unclassified,
    [],
    'per-VMI state registers with VmiRecords (vmi-records.ts PerVmiState, wired in controller.ts); add each field here with its table, or why it is not per-VMI',
  );
  assert.deepEqual(
    Object.keys(FIELDS).filter((f) => !found.includes(f)),
    [],
    'classified fields that are gone',
  );
});

const secret = (hostname: string): SecretObject => ({
  metadata: { name: 'ud', namespace: 'default' },
  stringData: { userdata: `#cloud-config\nhostname: ${hostname}\n` },
});

const domain = (state: FakeDomain['state']): FakeDomain => ({
  state,
  persistent: true,
  live: [],
  config: [],
  unplugs: true,
  scsi: true,
});

test(
  'a deleted VMI leaves nothing in its record or in any registered table; each table held it at deletion',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const lv = new FakeLibvirt();
    const client = new EventingFakeClient(lv);
    // KubeVirt's live-only injection: a defined, not started domain gets a
    // prepared attach; a started one (paused, as the seed gate holds it) the disk.
    const injector = new LibvirtInjector({ client, liveOnly: true, bus: 'scsi' });
    const seedReads = new FakeClient();
    const h = await startAgent(fake, {
      stateDir: dir.path,
      injector,
      domainEvents: clientDomainEvents({ onEvent: (l) => client.onEvent(l), watch: () => () => {} }, (x) =>
        injector.locate(x),
      ),
      seedReads,
      seedReadPolicy: { firstMs: 5, maxMs: 20, boundMs: 60_000, timeoutMs: 1000 },
      nocloudHttp: {},
      annotateVmis: { minIntervalMs: 20, sweepMs: 20 },
      resyncPeriodMs: 3_600_000,
    });
    t.after(h.stop);
    const records = h.agent.records;
    const registered = [...records.tables()].sort();
    assert.deepEqual(registered, classifiedTables(), 'every classified table is registered, and nothing else');

    lv.domains.set('default_waiting', domain('shut off'));
    lv.domains.set('default_running', domain('paused'));
    fake.setSecret(secret('one'));
    const cloudInit = 'secretRef: {name: ud}\n';
    fake.applyVmi(vmi('waiting', { cloudInit }));
    fake.applyVmi(vmi('running', { cloudInit }));

    const running = await waitFor('running seeded and attached', () => {
      const s = h.agent.status.get('default/running');
      return s?.state === 'ready' && s.firstBoot?.watch === 'polling' ? s : undefined;
    });
    // A Secret change: both VMIs count it in their version.
    fake.setSecret(secret('two'));
    await waitFor('running reseeded', () => h.agent.status.get('default/running')?.contentHash !== running.contentHash);
    // The guest fetched its meta-data over HTTP: a summary to annotate.
    h.agent.seeds!.recordFetch('default', 'running', 'meta-data', new Date());

    const all = ['record', ...registered].sort();
    const union = () =>
      [...new Set([...records.holding('default/waiting'), ...records.holding('default/running')])].sort();
    await waitFor('every table holding one of the two', () => union().length === all.length);
    assert.deepEqual(union(), all);
    // The parts that hold the waiting one's domain for its start.
    for (const name of ['queue', 'domain-waits', 'injector'])
      assert.ok(records.holding('default/waiting').includes(name), name);

    fake.deleteVmi('default', 'waiting');
    fake.deleteVmi('default', 'running');
    await waitFor(
      'both records ended',
      () => records.get('default/waiting') === undefined && records.get('default/running') === undefined,
    );
    await h.agent.queue.idle();
    await h.agent.events.flush();
    await h.agent.annotations!.idle();
    // Timers that would bring a key back (backoff, polls, sweeps) have had their turn.
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual(records.holding('default/waiting'), []);
    assert.deepEqual(records.holding('default/running'), []);
    assert.equal(lv.domains.get('default_running')!.live.length, 0, 'the attached disk went with the VMI');
  },
);
