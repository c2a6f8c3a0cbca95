// The per-domain lock the injector and the RPC client share: one turn at a
// time per domain, domains independent, a turn let go however it ends, and
// no key kept once its domain is idle.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DomainLock, type DomainTurn, type TurnOptions } from '../../src/libvirt/domain-lock.ts';
import { VmseedError } from '../../src/errors.ts';

const WHAT = 'the test work';

function deferred<T = void>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

// Lets every queued microtask and the next macrotask run.
const settle = () => new Promise((r) => setImmediate(r));

const cancelled = (e: unknown) => e instanceof VmseedError && e.code === 'CANCELLED';

// A turn on `key` whose work is `fn`, a side effect the test looks at.
function effect(lock: DomainLock, key: string, fn: () => void, o: Omit<TurnOptions<void>, 'what'> = {}) {
  return lock.run(key, async () => fn(), { what: WHAT, ...o });
}

test('one turn at a time per domain, in the order asked', async () => {
  const lock = new DomainLock();
  const log: string[] = [];
  let running = 0;
  const gates = [deferred(), deferred(), deferred()];
  const runs = gates.map((g, i) =>
    lock.run(
      'qemu:///system\0a',
      async () => {
        running++;
        assert.equal(running, 1, 'two turns of one domain at once');
        log.push(`start ${i}`);
        await g.promise;
        log.push(`end ${i}`);
        running--;
        return i;
      },
      { what: WHAT },
    ),
  );
  await settle();
  assert.deepEqual(log, ['start 0']);
  gates[2].resolve();
  gates[1].resolve();
  await settle();
  assert.deepEqual(log, ['start 0'], 'later turns wait for the first, whatever order their work is ready in');
  gates[0].resolve();
  assert.deepEqual(await Promise.all(runs), [0, 1, 2]);
  assert.deepEqual(log, ['start 0', 'end 0', 'start 1', 'end 1', 'start 2', 'end 2']);
});

test('different domains (or one name under two URIs) do not wait for each other', async () => {
  const lock = new DomainLock();
  const held = deferred();
  const first = lock.run('qemu:///system\0a', () => held.promise, { what: WHAT });
  assert.equal(await lock.run('qemu:///system\0b', async () => 'b', { what: WHAT }), 'b');
  assert.equal(await lock.run('qemu:///session\0a', async () => 'a elsewhere', { what: WHAT }), 'a elsewhere');
  held.resolve();
  await first;
});

test('a turn whose work throws is let go; its caller gets the error', async () => {
  const lock = new DomainLock();
  const boom = new Error('boom');
  const failed = effect(lock, 'k', () => {
    throw boom;
  });
  const next = lock.run('k', async () => 'ran', { what: WHAT });
  await assert.rejects(failed, (e) => e === boom);
  assert.equal(await next, 'ran');
  const thrownAtOnce = lock.run(
    'k',
    () => {
      throw boom;
    },
    { what: WHAT },
  );
  await assert.rejects(thrownAtOnce, (e) => e === boom);
  assert.equal(await lock.run('k', async () => 'ran again', { what: WHAT }), 'ran again');
});

test('aborted while waiting: the work never runs, and the turns behind it still do', async () => {
  const lock = new DomainLock();
  const held = deferred();
  const first = lock.run('k', () => held.promise, { what: WHAT });
  const ac = new AbortController();
  let ran = false;
  const waiting = effect(
    lock,
    'k',
    () => {
      ran = true;
    },
    { signal: ac.signal },
  );
  const third = lock.run('k', async () => 'third', { what: WHAT });
  ac.abort();
  // The caller is answered at the abort, not when the turn comes.
  await assert.rejects(waiting, (e) => cancelled(e) && (e as Error).message.includes(WHAT));
  held.resolve();
  await first;
  assert.equal(await third, 'third');
  assert.equal(ran, false);
  const pre = new AbortController();
  pre.abort();
  await assert.rejects(
    effect(
      lock,
      'k',
      () => {
        ran = true;
      },
      { signal: pre.signal },
    ),
    cancelled,
  );
  await lock.idle();
  assert.equal(ran, false, 'aborted before it asked: never runs');
});

test('aborted while running: the caller is answered at once; the domain stays held until the work ends', async () => {
  const lock = new DomainLock();
  const ac = new AbortController();
  const work = deferred();
  let ended = false;
  const running = lock.run('k', () => work.promise.then(() => void (ended = true)), {
    what: WHAT,
    signal: ac.signal,
  });
  let nextStarted = false;
  const next = lock.run(
    'k',
    async () => {
      nextStarted = true;
      assert.equal(ended, true, 'the next turn overtook the aborted work');
    },
    { what: WHAT },
  );
  await settle();
  ac.abort();
  await assert.rejects(running, cancelled);
  await settle();
  assert.equal(nextStarted, false);
  assert.equal(lock.size, 1);
  work.resolve();
  await next;
  assert.equal(nextStarted, true);
});

test('the work after a turn holds the domain; the caller does not wait for it', async () => {
  const lock = new DomainLock();
  const after = deferred();
  let afterSaw: string | undefined;
  const v = await lock.run('k', async () => 'value', {
    what: WHAT,
    after: async (value) => {
      afterSaw = value;
      await after.promise;
    },
  });
  assert.equal(v, 'value');
  assert.equal(afterSaw, 'value');
  let nextRan = false;
  const next = effect(lock, 'k', () => {
    nextRan = true;
  });
  await settle();
  assert.equal(nextRan, false);
  after.reject(new Error('a failed after step lets go too'));
  await next;
  assert.equal(nextRan, true);
});

test('calls made inside a turn, naming it, run in it one after the other', async () => {
  const lock = new DomainLock();
  const log: string[] = [];
  const first = deferred();
  const outer = lock.run(
    'k',
    async (turn) => {
      log.push('outer');
      // They do not wait for the turn they are in (that would never end),
      // but do wait for each other.
      const one = lock.run(
        'k',
        async () => {
          log.push('inner 1');
          await first.promise;
          log.push('inner 1 end');
        },
        { what: WHAT, within: turn },
      );
      const two = effect(
        lock,
        'k',
        () => {
          log.push('inner 2');
        },
        { within: turn },
      );
      await Promise.all([one, two]);
      log.push('outer end');
    },
    { what: WHAT },
  );
  const next = effect(lock, 'k', () => {
    log.push('next turn');
  });
  await settle();
  assert.deepEqual(log, ['outer', 'inner 1']);
  first.resolve();
  await Promise.all([outer, next]);
  assert.deepEqual(log, ['outer', 'inner 1', 'inner 1 end', 'inner 2', 'outer end', 'next turn']);
});

test('a call inside a turn that outlives the turn (both cancelled) holds the domain until it ends', async () => {
  const lock = new DomainLock();
  const stop = new AbortController();
  const answer = deferred();
  let answered = false;
  const outer = lock.run(
    'k',
    (turn) =>
      lock.run(
        'k',
        async () => {
          await answer.promise;
          answered = true;
        },
        { what: WHAT, signal: stop.signal, within: turn },
      ),
    { what: WHAT, signal: stop.signal },
  );
  let nextSawAnswer: boolean | undefined;
  const next = effect(lock, 'k', () => {
    nextSawAnswer = answered;
  });
  await settle();
  // Both callers are answered at the stop, so the turn's own work is over;
  // the call it made is still out.
  stop.abort();
  await assert.rejects(outer, cancelled);
  await settle();
  assert.equal(nextSawAnswer, undefined, 'the next turn overtook a call still out');
  answer.resolve();
  await next;
  assert.equal(nextSawAnswer, true);
});

// A turn held on `key` until release(); `turn` is the one its work got.
async function holdTurn(lock: DomainLock, key: string) {
  const held = deferred();
  let turn: DomainTurn | undefined;
  const done = lock.run(
    key,
    async (t) => {
      turn = t;
      await held.promise;
    },
    { what: WHAT },
  );
  await settle();
  return { turn: turn!, release: () => (held.resolve(), done) };
}

test("a turn that is over, another domain's, or another lock's is not joined: the call queues", async () => {
  const lock = new DomainLock();
  const over = await holdTurn(lock, 'k');
  await over.release();
  const holder = await holdTurn(lock, 'k');
  const otherLock = await holdTurn(new DomainLock(), 'k');
  const otherDomain = await holdTurn(lock, 'b');
  const ran: string[] = [];
  const calls = (
    [
      ['over', over.turn],
      ['other lock', otherLock.turn],
      ['other domain', otherDomain.turn],
    ] as const
  ).map(([name, within]) =>
    effect(
      lock,
      'k',
      () => {
        ran.push(name);
      },
      { within },
    ),
  );
  await settle();
  assert.deepEqual(ran, [], 'a call ran inside a turn that was not one it could join');
  await holder.release();
  await Promise.all(calls);
  assert.deepEqual(ran, ['over', 'other lock', 'other domain']);
  await Promise.all([otherLock.release(), otherDomain.release()]);
});

test('a domain with nothing running or waiting is dropped, however its last turn ended', async () => {
  const lock = new DomainLock();
  const ac = new AbortController();
  const work = deferred();
  const runs: Array<Promise<unknown>> = [];
  for (let i = 0; i < 100; i++) runs.push(lock.run(`d${i}`, async () => i, { what: WHAT }));
  runs.push(lock.run('thrower', () => Promise.reject(new Error('x')), { what: WHAT }));
  runs.push(lock.run('aborted', () => work.promise, { what: WHAT, signal: ac.signal }));
  runs.push(lock.run('aborted', async () => {}, { what: WHAT }));
  assert.equal(lock.size, 102);
  await settle();
  ac.abort();
  await Promise.allSettled(runs.slice(0, -1));
  await settle();
  assert.equal(lock.size, 1, 'the aborted work still runs: its domain is held');
  work.resolve();
  await Promise.allSettled(runs);
  await lock.idle();
  await settle();
  assert.equal(lock.size, 0);
});
