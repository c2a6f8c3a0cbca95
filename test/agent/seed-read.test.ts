// The guest's first read of its seed disk, seen through libvirt's block
// statistics: polled with backoff only between attach and read, ended by
// the read, the domain going, the bound or the VMI's deletion; the domain's
// start time only from a start event this agent received. Then the agent as
// a whole: the status page's first-boot fields, the SeedRead Event and the
// histograms.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { VmseedError } from '../../src/errors.ts';
import {
  STARTS_MAX,
  SeedReadWatch,
  firstBootStatus,
  type FirstBootFacts,
  type SeedReadPolicy,
} from '../../src/agent/domain/seed-read.ts';
import { VmiRecords } from '../../src/agent/vmi-records.ts';
import { fakeKubeAndDir, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { AttachingInjector, FakeClient, URI } from '../support/seed-read-doubles.ts';
import { parseExposition, sampleValue } from '../support/promtool.ts';

const FAST: SeedReadPolicy = { firstMs: 5, maxMs: 40, boundMs: 60_000, timeoutMs: 1000 };

function setup(policy: SeedReadPolicy = FAST, now?: () => number) {
  const client = new FakeClient();
  const records = new VmiRecords();
  const changes: FirstBootFacts[] = [];
  const watch = new SeedReadWatch({
    client,
    records,
    onChange: (_key, f) => changes.push({ ...f }),
    logger: pino({ level: 'silent' }),
    policy,
    ...(now ? { now } : {}),
  });
  watch.start();
  records.of('ns/vm');
  return { client, records, changes, watch };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('start event, attach, reads after a few polls: read recorded once, then no more polls', async () => {
  const { client, changes, watch, records } = setup();
  client.emit('ns_vm', 'started');
  const started = watch.startedAt(URI, 'ns_vm');
  assert.ok(started !== undefined);
  const facts = watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() });
  assert.equal(facts?.startedAt, started);
  assert.equal(records.get('ns/vm')?.firstBoot, facts);
  await waitFor('three polls', () => client.calls.length >= 3);
  client.reads = 2;
  await waitFor('the read', () => changes.length === 1);
  assert.equal(changes[0].watch, 'read');
  assert.ok(changes[0].readAt! >= changes[0].attachedAt);
  assert.deepEqual(new Set(client.calls.map((c) => `${c.domain} ${c.target}`)), new Set(['ns_vm sdzz']));
  const polls = client.calls.length;
  await sleep(150);
  assert.equal(client.calls.length, polls, 'polled after the read');
  assert.equal(watch.polling, 0);
  const shown = firstBootStatus(changes[0]);
  assert.equal(shown.watch, 'read');
  assert.ok(shown.attachAfterStartSeconds !== undefined && shown.readAfterStartSeconds !== undefined);
  assert.ok(shown.readAfterStartSeconds >= shown.attachAfterStartSeconds);
});

test('the poll interval doubles from firstMs up to maxMs', async () => {
  const { client, watch } = setup({ firstMs: 10, maxMs: 40, boundMs: 60_000, timeoutMs: 1000 });
  watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() });
  await waitFor('six polls', () => client.calls.length >= 6, 20_000);
  watch.stop();
  const gaps = client.calls.slice(1).map((c, i) => c.at - client.calls[i].at);
  // Timers fire no earlier than asked: 20, 40, 40, 40 ms at least.
  assert.ok(gaps[0] >= 18 && gaps[1] >= 38 && gaps[2] >= 38, `gaps ${gaps.join(', ')}`);
});

test('no start event seen (the agent came later): the margins are unknown, not estimated', () => {
  const { watch } = setup();
  const f = watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() })!;
  watch.stop();
  assert.equal(f.startedAt, undefined);
  const shown = firstBootStatus(f);
  assert.equal(shown.domainStartedAt, undefined);
  assert.equal(shown.attachAfterStartSeconds, undefined);
});

test('a start of another domain or another libvirt is not this domain start', () => {
  const { client, watch } = setup();
  client.emit('ns_other', 'started');
  client.emit('ns_vm', 'started', 'qemu:///system');
  const f = watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() })!;
  watch.stop();
  assert.equal(f.startedAt, undefined);
});

test('the domain stops while polled: domain-gone, polling ends; its start is forgotten', async () => {
  const { client, changes, watch } = setup();
  client.emit('ns_vm', 'started');
  watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() });
  await waitFor('a poll', () => client.calls.length >= 1);
  client.emit('ns_vm', 'stopped');
  assert.equal(changes.at(-1)?.watch, 'domain-gone');
  assert.equal(watch.polling, 0);
  assert.equal(watch.startedAt(URI, 'ns_vm'), undefined);
});

test('libvirt says the domain is not there: domain-gone', async () => {
  const { client, changes, watch } = setup();
  client.fail = new VmseedError('DOMAIN_NOT_FOUND', 'no domain', { kind: 'retryable' });
  watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() });
  await waitFor('domain-gone', () => changes.at(-1)?.watch === 'domain-gone');
  assert.equal(watch.polling, 0);
});

test('other failures keep polling; past the bound: not-read, polling ends', async () => {
  let t = 0;
  const { client, changes, watch } = setup({ firstMs: 5, maxMs: 10, boundMs: 1000, timeoutMs: 100 }, () => t);
  client.fail = new VmseedError('LIBVIRT_TIMEOUT', 'busy', { kind: 'retryable' });
  watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: 0 });
  await waitFor('polls', () => client.calls.length >= 3);
  assert.equal(changes.length, 0);
  client.fail = undefined;
  t = 1000;
  await waitFor('not-read', () => changes.at(-1)?.watch === 'not-read');
  assert.equal(watch.polling, 0);
});

test('the VMI deleted while polled: no more polls, nothing reported', async () => {
  const { client, changes, watch, records } = setup();
  records.register('seed-reads', watch);
  watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() });
  await waitFor('a poll', () => client.calls.length >= 1);
  assert.equal(watch.holds('ns/vm'), true);
  records.end('ns/vm');
  assert.equal(watch.holds('ns/vm'), false);
  const n = client.calls.length;
  client.reads = 5;
  await sleep(100);
  assert.ok(client.calls.length <= n + 1, 'at most the poll already in flight');
  assert.deepEqual(changes, []);
});

test('a second attach after the same start (a new seed) keeps the first; a new start is a new first boot', () => {
  const { client, watch } = setup();
  client.emit('ns_vm', 'started');
  const first = watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() });
  assert.ok(first);
  assert.equal(
    watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() }),
    undefined,
  );
  client.emit('ns_vm', 'stopped');
  client.emit('ns_vm', 'started');
  assert.ok(
    watch.attached('ns/vm', 'u1', { uri: URI, domain: 'ns_vm', targetDev: 'sdzz', attachedAt: Date.now() + 1 }),
  );
  watch.stop();
});

test('start times are bounded: a flood of domains evicts the oldest', () => {
  const { client, watch } = setup();
  for (let i = 0; i <= STARTS_MAX; i++) client.emit(`d${i}`, 'started');
  assert.equal(watch.startedAt(URI, 'd0'), undefined);
  assert.ok(watch.startedAt(URI, `d${STARTS_MAX}`) !== undefined);
  watch.stop();
});

test(
  'agent: margin on the status page, the guest read as a SeedRead Event, both histograms; disk SEEDED_AFTER_BOOT counted',
  { timeout: 30_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const client = new FakeClient();
    const injector = new AttachingInjector();
    const h = await startAgent(fake, { stateDir: dir.path, injector, seedReads: client, seedReadPolicy: FAST });
    t.after(h.stop);

    client.emit('default_gated', 'started');
    fake.applyVmi(vmi('gated'));
    const fb = await waitFor('attached', () => h.agent.status.get('default/gated')?.firstBoot);
    assert.equal(fb.watch, 'polling');
    assert.ok(fb.domainStartedAt !== undefined && fb.attachAfterStartSeconds !== undefined);
    client.reads = 1;
    const read = await waitFor('read', () => {
      const f = h.agent.status.get('default/gated')?.firstBoot;
      return f?.watch === 'read' ? f : undefined;
    });
    assert.ok(read.seedReadAt !== undefined && read.readAfterStartSeconds !== undefined);
    await h.agent.events.flush();
    const ev = fake.events().filter((e) => e.reason === 'SeedRead' && e.involvedObject.name === 'gated');
    assert.equal(ev.length, 1);
    assert.match(
      ev[0].message,
      /^seed read by guest: first read of disk sdzz in default_gated at \S+Z, .+ after the domain started/,
    );

    // A domain running when the seed came: counted, the margin unknown (no start seen).
    injector.running = true;
    client.reads = 0;
    fake.applyVmi(vmi('late'));
    const late = await waitFor('late attached', () => h.agent.status.get('default/late')?.firstBoot);
    assert.equal(late.attachAfterStartSeconds, undefined);
    const s = parseExposition(await h.metrics.registry.metrics());
    assert.equal(sampleValue(s, 'vmseed_seed_attach_after_start_seconds_count'), 1);
    assert.equal(sampleValue(s, 'vmseed_seed_read_after_start_seconds_count'), 1);
    assert.equal(sampleValue(s, 'vmseed_seeded_after_boot_total', { datasource: 'disk' }), 1);
  },
);

test("docs/kubevirt.md's numbers for the seed-read polls and the launcher reconnect are the code's", async () => {
  const { readFileSync } = await import('node:fs');
  const { SEED_READ_POLICY, POLLING_MAX } = await import('../../src/agent/domain/seed-read.ts');
  const { CONNECT_BACKOFF_MAX_MS } = await import('../../src/commands/agent/agent-command.ts');
  const doc = readFileSync(new URL('../../docs/kubevirt.md', import.meta.url), 'utf8');
  const at = doc.indexOf("\n## Without the gate: the seed at the domain's start");
  assert.ok(at >= 0, 'the section is there');
  const end = doc.indexOf('\n## ', at + 1);
  const section = doc.slice(at, end < 0 ? undefined : end).replace(/\s+/g, ' ');
  assert.equal(CONNECT_BACKOFF_MAX_MS, 500);
  assert.match(section, /tried again at least every 0\.5 s/);
  assert.equal(SEED_READ_POLICY.firstMs, 100);
  assert.equal(SEED_READ_POLICY.maxMs, 5_000);
  assert.equal(SEED_READ_POLICY.boundMs, 15 * 60_000);
  assert.match(section, /from 100 ms after the attach, the interval doubling up to 5 s/);
  assert.match(section, /or 15 minutes after the attach/);
  assert.equal(POLLING_MAX, 1024);
  assert.match(section, /at most 1,024 at once/);
});
