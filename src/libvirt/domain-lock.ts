// One change at a time per libvirt domain; different domains run
// concurrently. The injector and the RPC client it drives share one lock:
// the injector's turn covers a whole injection (read, decide, change), and
// the client's calls made in that turn name it, so they run inside it
// instead of queueing behind it (which would never end).
import { cancelledBy } from '../errors.ts';

/**
 * A turn held on one domain, given to the work that runs in it: calls that
 * pass it to the same lock run inside the turn, one after the other.
 */
export interface DomainTurn {
  readonly key: string;
}

/** What a turn carries besides its work. */
export interface TurnOptions<T> {
  // Names the work in the CANCELLED error.
  what: string;
  // Aborted while the work waits for its turn: it never runs. Aborted
  // later: the caller gets CANCELLED at once, and the domain stays held
  // until the work itself has ended, so nothing overtakes it.
  signal?: AbortSignal;
  // Work on the domain's behalf that the caller does not wait for; the
  // domain's next turn still does.
  after?: (value: T) => Promise<unknown>;
  // The caller's own turn on the same domain, when it holds one.
  within?: DomainTurn;
}

// A turn's queue for the calls made inside it. Closed once the turn's work
// has ended: a late call takes a turn of its own.
class Turn implements DomainTurn {
  readonly key: string;
  readonly lock: DomainLock;
  open = true;
  tail: Promise<unknown> = Promise.resolve();

  constructor(key: string, lock: DomainLock) {
    this.key = key;
    this.lock = lock;
  }
}

/** Serializes work per libvirt domain, keyed by `domainId(uri, domain)`. */
export class DomainLock {
  // The last turn queued per key; a key is dropped once that turn is over,
  // so domains that went do not stay.
  readonly #tails = new Map<string, Promise<unknown>>();

  /**
   * Runs `fn` when every earlier turn on `key` is over (or, with `within`,
   * every earlier call inside that turn), and holds `key` until `fn`, the
   * calls made inside its turn and `after` are over.
   */
  run<T>(key: string, fn: (turn: DomainTurn) => Promise<T>, o: TurnOptions<T>): Promise<T> {
    const { what, signal, after, within } = o;
    const parent =
      within instanceof Turn && within.lock === this && within.key === key && within.open ? within : undefined;
    const prev = parent ? parent.tail : (this.#tails.get(key) ?? Promise.resolve());
    const turn = new Turn(key, this);
    const start = (): Promise<T> => {
      if (signal?.aborted) throw cancelledBy(signal, what);
      return fn(turn);
    };
    const next = prev.then(start, start);
    const close = () => {
      turn.open = false;
      return turn.tail;
    };
    const tail = Promise.allSettled([next.then(close, close), after ? next.then(after) : next]);
    if (parent) {
      parent.tail = tail;
    } else {
      this.#tails.set(key, tail);
      void tail.then(() => {
        if (this.#tails.get(key) === tail) this.#tails.delete(key);
      });
    }
    return signal ? untilAborted(next, signal, what) : next;
  }

  /** Resolves once every turn queued so far (and the work after it) is over. */
  async idle(): Promise<void> {
    await Promise.all(this.#tails.values());
  }

  /** Domains with a turn running or waiting. */
  get size(): number {
    return this.#tails.size;
  }
}

/**
 * Settles as `work` does, or with CANCELLED (naming `what`) once `signal`
 * aborts; the work itself still ends in the background (holding its
 * domain's turn, if it has one, until it does).
 */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal, what: string): Promise<T> {
  if (signal.aborted) {
    work.catch(() => {});
    return Promise.reject(cancelledBy(signal, what));
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(cancelledBy(signal, what));
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
