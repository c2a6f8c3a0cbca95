// A seed never waits for the schema check's first compile: while a release
// is cold, a render skips the check; once the agent is idle the release is
// warmed and the VMI reconciled again, which adds the warnings (and their
// Events) to the same seed. Its own file: the release must be cold in this
// process when the test starts.
import '../support/schema-files.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { VmiObject } from '../../src/api/objects.ts';
import { BATCH, SchemaWarmup } from '../../src/agent/schema-warmup.ts';
import { warmUpSteps } from '../../src/cloudinit/schema/check.ts';
import type { CiProfile } from '../../src/cloudinit/schema/ci-validator.ts';
import { DEFAULT_SCHEMA_DIR, schemaStore } from '../../src/cloudinit/schema/schema-store.ts';
import { fakeKubeAndDir, imagesOf, startAgent, vmi, waitFor } from '../support/agent-harness.ts';

const bad = 'userData: |\n  #cloud-config\n  runcmd: "echo hi"\n';

test('the first seed is not held for the compile: written, then its schema warnings follow on the same image', async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  assert.equal(schemaStore(DEFAULT_SCHEMA_DIR).isWarm('25.1'), false, 'cold at the start');
  const deferred: string[] = [];
  const warmed: CiProfile[] = [];
  const warmup = new SchemaWarmup({
    steps: (release) => {
      warmed.push(release);
      return warmUpSteps(DEFAULT_SCHEMA_DIR, release);
    },
    onError: (_r, e) => assert.fail(String(e)),
  });
  const h = await startAgent(fake, {
    stateDir: dir.path,
    schemaCheck: {
      dir: DEFAULT_SCHEMA_DIR,
      release: '25.1',
      deferCold: (v: VmiObject, r: CiProfile) => {
        deferred.push(`${v.metadata.name} ${r}`);
        return warmup.defer(v, r);
      },
    },
  });
  t.after(h.stop);
  warmup.bind({ idle: () => h.agent.queue.idle(), requeue: (key) => h.agent.queue.add(key) });

  const v = fake.applyVmi(vmi('web', { cloudInit: bad }));
  const status = await waitFor(
    'the schema warning',
    () => {
      const s = h.agent.status.get('default/web');
      return s?.warnings.some((w) => w.code === 'CLOUDCONFIG_SCHEMA') ? s : undefined;
    },
    30_000,
  );
  await h.agent.queue.idle();
  assert.deepEqual(deferred, ['web 25.1'], 'deferred once, while cold');
  assert.deepEqual(warmed, ['25.1']);
  assert.equal(status.state, 'warning');
  assert.match(
    status.warnings.find((w) => w.code === 'CLOUDCONFIG_SCHEMA')!.message,
    /runcmd: a string is not of type 'array'/,
  );
  assert.equal(imagesOf(h.store, v).length, 1, 'one image: the warnings did not change the seed');
  const events = await waitFor('the SeedWarning Event', () => {
    const e = fake.events().filter((x) => x.involvedObject.name === 'web');
    return e.some((x) => x.reason === 'SeedWarning') ? e : undefined;
  });
  const warnings = events.filter((x) => x.reason === 'SeedWarning');
  assert.equal(warnings.length, 1);
  assert.match(warnings[0].message, /^CLOUDCONFIG_SCHEMA: user-data: runcmd: /);
  assert.equal(warnings[0].count, 1);
  assert.equal(events.filter((x) => x.reason === 'SeedReady').length, 1);

  // Warm now: the next VMI is checked on its first render.
  fake.applyVmi(vmi('db', { cloudInit: bad }));
  await waitFor('db checked', () =>
    h.agent.status.get('default/db')?.warnings.some((w) => w.code === 'CLOUDCONFIG_SCHEMA'),
  );
  assert.deepEqual(deferred, ['web 25.1']);
});

test('SchemaWarmup: waits for idle, warms once, requeues what it deferred; a failed warm-up is not retried', async () => {
  let idle: () => void = () => {};
  const requeued: string[] = [];
  const errors: string[] = [];
  let warms = 0;
  const w = new SchemaWarmup({
    steps: () => [
      () => {
        warms++;
        throw new Error('schema files unreadable');
      },
      () => assert.fail('no step after a failed one'),
    ],
    onError: (release, e) => errors.push(`${release}: ${(e as Error).message}`),
  });
  w.bind({ idle: () => new Promise((r) => (idle = r)), requeue: (k) => requeued.push(k) });
  const a = vmi('a');
  const b = vmi('b', { namespace: 'ns' });
  assert.equal(w.defer(a, '22.4'), true);
  assert.equal(w.defer(b, '22.4'), true);
  await new Promise((r) => setImmediate(r));
  await new Promise((r) => setImmediate(r));
  assert.deepEqual([warms, requeued], [0, []], 'nothing before the queue is idle');
  idle();
  await waitFor('requeued', () => requeued.length === 2);
  assert.deepEqual(requeued.sort(), ['default/a', 'ns/b']);
  assert.deepEqual(errors, ['22.4: schema files unreadable']);
  assert.equal(warms, 1);
  // Tried: checks go ahead (they report the files' problem themselves).
  assert.equal(w.defer(a, '22.4'), false);
  w.stop();
  assert.equal(w.defer(a, '25.1'), false, 'stopped: nothing deferred');
});

test('SchemaWarmup: a step at a time and BATCH VMIs at a time, the queue idle between', async () => {
  const idles: (() => void)[] = [];
  const requeued: string[] = [];
  const ran: number[] = [];
  const w = new SchemaWarmup({
    steps: () => [() => ran.push(1), () => ran.push(2)],
    onError: (_r, e) => assert.fail(String(e)),
  });
  w.bind({ idle: () => new Promise((r) => idles.push(() => r())), requeue: (k) => requeued.push(k) });
  for (let i = 0; i < BATCH * 2 + 3; i++) w.defer(vmi(`v${i}`), '25.1');
  const next = async (): Promise<void> => {
    await waitFor('the warm-up waiting for idle', () => idles.length > 0);
    idles.shift()!();
    await new Promise((r) => setImmediate(r));
  };
  await next();
  assert.deepEqual([ran, requeued.length], [[1], 0]);
  await next();
  assert.deepEqual([ran, requeued.length], [[1, 2], 0]);
  await next();
  assert.equal(requeued.length, BATCH);
  await next();
  assert.equal(requeued.length, BATCH * 2);
  await next();
  assert.equal(requeued.length, BATCH * 2 + 3);
  assert.equal(new Set(requeued).size, requeued.length);
});
