// The object cache's own rules, with a scripted watcher and API and a mocked
// clock: how long a failed watch waits before its renewal (capped
// exponential backoff, jittered), how a 410 is answered (a fresh watch after
// a random moment, then one read), and when a watch is stopped (an object
// that becomes immutable, a VMI that stops reading it), and the spread of the
// timeoutSeconds every watch asks.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import type { SecretObject } from '../../src/api/objects.ts';
import type { KubeApi } from '../../src/kube/api-client.ts';
import type { KubeConnection } from '../../src/kube/connection.ts';
import type { Watcher } from '../../src/kube/list-watch.ts';
import type { WatchError } from '../../src/kube/watch.ts';
import { ObjectWatches, type ObjectWatchesOptions } from '../../src/kube/object-watches.ts';

interface OpenedWatch {
  query: Record<string, string>;
  event(phase: string, obj: unknown): void;
  end(err: unknown): void;
  aborted: boolean;
}

const secret = (rv: string, extra: Record<string, unknown> = {}): SecretObject => ({
  metadata: { name: 's', namespace: 'ns', resourceVersion: rv },
  data: {},
  ...extra,
});

function watchError(statusCode: number, retryAfterMs?: number): WatchError {
  const e = new Error(`watch: ${statusCode}`) as WatchError;
  e.statusCode = statusCode;
  if (retryAfterMs !== undefined) e.retryAfterMs = retryAfterMs;
  return e;
}

// Lets promise callbacks run; the mocked clock does not move.
const settle = () => new Promise<void>((r) => setImmediate(r));

function setup(t: TestContext, options: Partial<ObjectWatchesOptions> = {}) {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const opened: OpenedWatch[] = [];
  let gets = 0;
  let current: SecretObject | undefined = secret('5');
  const api: KubeApi = {
    request: async () => {
      gets++;
      return current ? { status: 200, body: current } : { status: 404, body: undefined };
    },
  };
  const watcher: Watcher = {
    watch: async (_path, query, callback, done) => {
      const w: OpenedWatch = {
        query,
        event: (phase, obj) => callback(phase, obj),
        end: (err) => done(err),
        aborted: false,
      };
      opened.push(w);
      return { abort: () => (w.aborted = true) };
    },
  };
  const users: string[][] = [];
  const w = new ObjectWatches({
    api,
    watcher,
    logger: pino({ level: 'silent' }),
    backoff: { baseMs: 1000, maxMs: 8000 },
    goneReadSpreadMs: 2000,
    ...options,
  });
  w.onChange((u) => users.push([...u]));
  t.after(() => w.stop());
  const depend = async (user: string) => {
    const r = w.reader(user);
    await r.getSecret('ns', 's');
    w.use(user, r.read());
    r.done();
  };
  return {
    w,
    opened,
    users,
    depend,
    gets: () => gets,
    setCurrent: (s: SecretObject | undefined) => (current = s),
    last: () => opened.at(-1)!,
  };
}

// Ticks until a new watch opens, returning how long that took (at most `limit`).
async function untilNextWatch(t: TestContext, opened: OpenedWatch[], limit: number): Promise<number> {
  const before = opened.length;
  for (let ms = 0; ms <= limit; ms += 10) {
    await settle();
    if (opened.length > before) return ms;
    t.mock.timers.tick(10);
  }
  await settle();
  return opened.length > before ? limit : Infinity;
}

test('a failed watch is renewed after a capped exponential backoff, jittered over its upper half', async (t) => {
  const randoms = [0, 1, 0.5, 0, 1, 1];
  let i = 0;
  const s = setup(t, { random: () => randoms[i++ % randoms.length] });
  await s.depend('ns/vm');
  await settle();
  assert.equal(s.opened.length, 1);
  assert.equal(s.last().query.resourceVersion, '5');
  assert.equal(s.last().query.fieldSelector, 'metadata.name=s');

  // base 1000 ms doubling to the 8000 ms cap; each wait in [step/2, step].
  const expected = [500, 2000, 3000, 4000, 8000, 8000];
  const waited: number[] = [];
  for (let n = 0; n < expected.length; n++) {
    s.last().end(watchError(500));
    waited.push(await untilNextWatch(t, s.opened, 10_000));
    assert.equal(s.last().query.resourceVersion, '5', 'resumed, not read again');
  }
  assert.deepEqual(waited, expected);
  assert.equal(s.gets(), 1);

  // An event is the watch working again: the next failure starts from the base.
  s.last().event('MODIFIED', secret('6'));
  s.last().end(watchError(500));
  assert.equal(await untilNextWatch(t, s.opened, 10_000), 500);
  assert.equal(s.last().query.resourceVersion, '6');
});

test("a server's Retry-After is honoured when longer than the backoff", async (t) => {
  const s = setup(t, { random: () => 1 });
  await s.depend('ns/vm');
  await settle();
  s.last().end(watchError(429, 5000));
  assert.equal(await untilNextWatch(t, s.opened, 10_000), 5000);
});

test('the server ending a watch renews it at once from its resourceVersion, no read', async (t) => {
  const s = setup(t);
  await s.depend('ns/vm');
  await settle();
  s.last().event('BOOKMARK', { metadata: { resourceVersion: '9' } });
  s.last().end(null);
  await settle();
  assert.equal(s.opened.length, 2);
  assert.equal(s.last().query.resourceVersion, '9');
  assert.equal(s.gets(), 1);
});

test('410 Gone: a fresh watch after a random moment of the spread, then one read once it is open', async (t) => {
  for (const [r, wait] of [
    [0.25, 500],
    [0.75, 1500],
  ] as const) {
    await t.test(`random ${r}`, async (t) => {
      const s = setup(t, { random: () => r });
      await s.depend('ns/vm');
      await settle();
      s.last().end(watchError(410));
      assert.equal(await untilNextWatch(t, s.opened, 5000), wait);
      assert.equal(s.last().query.resourceVersion, undefined, 'from the current state');
      await settle();
      assert.equal(s.gets(), 2, 'one fresh read');
      // What the read found changed: the VMIs reading it hear of it.
      s.setCurrent(secret('7'));
      s.last().end(watchError(410));
      await untilNextWatch(t, s.opened, 5000);
      await settle();
      assert.equal(s.gets(), 3);
      assert.deepEqual(s.users, [['ns/vm']]);
    });
  }
});

test('an object that becomes immutable is no longer watched', async (t) => {
  const counts: number[] = [];
  const s = setup(t, { onWatchCount: (n) => counts.push(n) });
  await s.depend('ns/vm');
  await settle();
  assert.equal(s.w.openWatches, 1);
  s.last().event('MODIFIED', secret('6', { immutable: true }));
  await settle();
  assert.equal(s.last().aborted, true);
  assert.equal(s.w.openWatches, 0);
  assert.deepEqual(counts, [1, 0], 'vmseed_object_watches follows');
  assert.equal(s.w.dependencies('ns/vm')[0]?.immutable, true);
  // Its stream's end is not a reason to watch again.
  s.last().end(null);
  t.mock.timers.tick(120_000);
  await settle();
  assert.equal(s.opened.length, 1);
  assert.equal(s.gets(), 1);
});

test('shared by its readers, stopped when the last one stops reading it', async (t) => {
  const s = setup(t);
  await s.depend('ns/a');
  await s.depend('ns/b');
  await settle();
  assert.equal(s.opened.length, 1, 'one watch for both');
  assert.equal(s.gets(), 1, 'one read for both');
  s.last().event('MODIFIED', secret('6'));
  assert.deepEqual(s.users.at(-1)?.sort(), ['ns/a', 'ns/b']);
  s.w.use('ns/a', []); // a now reads something else, or nothing
  assert.equal(s.last().aborted, false);
  s.w.release('ns/b');
  assert.equal(s.last().aborted, true);
  assert.equal(s.w.openWatches, 0);
  assert.equal(s.w.cachedObjects, 0);
});

// A reconcile reads an object, renders, and only then makes what it read
// its VMI's dependencies: an edit in between (already streamed, since the
// watch starts at the read's resourceVersion) goes to the reader, or the
// seed keeps the content read before it until some other change.
test('an edit between the first read and use() is reported to the VMI reading it', async (t) => {
  const s = setup(t);
  const r = s.w.reader('ns/vm');
  assert.equal((await r.getSecret('ns', 's'))?.metadata.resourceVersion, '5');
  await settle();
  assert.equal(s.opened.length, 1, 'watched from the read');
  assert.equal(s.last().query.resourceVersion, '5');
  s.last().event('MODIFIED', secret('6'));
  assert.deepEqual(s.users, [['ns/vm']], 'the reader hears of it before it depends on the object');
  s.w.use('ns/vm', r.read());
  r.done();
  assert.equal(s.last().aborted, false, 'the same watch goes on');
  s.last().event('MODIFIED', secret('7'));
  assert.deepEqual(s.users, [['ns/vm'], ['ns/vm']]);
  assert.equal(s.gets(), 1);
});

test("renewals are spread: each watch asks a timeoutSeconds at random in 5-10 min, client-go's reflector's bound", async () => {
  const { BoundedWatch, MIN_WATCH_TIMEOUT_MS } = await import('../../src/kube/watch.ts');
  const asked = (r: number) =>
    new BoundedWatch({ connection: {} as KubeConnection, random: () => r }).nextTimeoutSeconds();
  assert.equal(MIN_WATCH_TIMEOUT_MS, 300_000);
  assert.equal(asked(0), 300);
  assert.equal(asked(0.5), 450);
  assert.equal(asked(0.999), 599);
});
