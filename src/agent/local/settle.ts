// Per-path "read once it has settled": file events only say that a path may
// have changed. chokidar drops some (a second `change` within 50 ms, a
// second removal within 100 ms) and turns an unlink and add into a change,
// so no event is taken as the content or as the final one. Each event
// restarts the path's quiet timer; once the path has been quiet for the
// settle interval its reader runs, one read at a time per path, and an
// event during a read runs it again afterwards. The reader may ask for a
// second look a settle interval later (a removal is applied only when two
// reads agree).

export type SettleResult = 'done' | 'confirm';

export interface PathSettlerOptions {
  settleMs: number;
  // A path touched without pause is still read this long after its first
  // touch, so a file rewritten continuously is not starved.
  maxWaitMs: number;
  // `current()` is false once the path was touched after this read began:
  // what it read may be older than the file, and another read follows.
  // `quiet`: no touch since the previous read of the path began, so the
  // two saw the file with nothing in between.
  read: (path: string, current: () => boolean, quiet: boolean) => Promise<SettleResult>;
  onError: (path: string, error: unknown) => void;
}

interface Entry {
  first: number;
  last: number;
  touches: number;
  // `touches` when the previous read began.
  previous: number | undefined;
  // A recheck asked for while reading: read once more afterwards.
  again: boolean;
  timer: NodeJS.Timeout | undefined;
  // Set before the reader is called (it may touch the path at once).
  busy: boolean;
  running: Promise<void> | undefined;
}

export class PathSettler {
  readonly #o: PathSettlerOptions;
  readonly #entries = new Map<string, Entry>();
  #closed = false;

  constructor(options: PathSettlerOptions) {
    this.#o = options;
  }

  // Something happened at `path` (or may have: a resync).
  touch(path: string): void {
    if (this.#closed) return;
    const e = this.#entry(path);
    e.touches++;
    e.last = Date.now();
    if (!e.busy) this.#schedule(path, e);
  }

  // The path may have changed without an event naming it (a directory
  // listed again, chokidar's own late events, a resync): a read follows,
  // without voiding one in progress or postponing one that waits.
  recheck(path: string): void {
    if (this.#closed) return;
    const known = this.#entries.get(path);
    if (known?.busy) known.again = true;
    else if (!known) this.#schedule(path, this.#entry(path));
  }

  // Read `path` now, without waiting for it to settle (the initial load),
  // and resolve once that read is done.
  async readNow(path: string): Promise<void> {
    const e = this.#entry(path);
    while (e.running) await e.running;
    if (this.#closed || this.#entries.get(path) !== e) return;
    clearTimeout(e.timer);
    await this.#start(path, e);
  }

  // Paths waiting for their quiet interval or being read.
  get pending(): number {
    return this.#entries.size;
  }

  // No new reads start; the ones running are awaited.
  async close(): Promise<void> {
    this.#closed = true;
    const running: Array<Promise<void>> = [];
    for (const e of this.#entries.values()) {
      clearTimeout(e.timer);
      if (e.running) running.push(e.running);
    }
    await Promise.all(running);
    this.#entries.clear();
  }

  #entry(path: string): Entry {
    let e = this.#entries.get(path);
    if (!e) {
      const now = Date.now();
      e = {
        first: now,
        last: now,
        touches: 0,
        previous: undefined,
        again: false,
        timer: undefined,
        busy: false,
        running: undefined,
      };
      this.#entries.set(path, e);
    }
    return e;
  }

  #schedule(path: string, e: Entry): void {
    clearTimeout(e.timer);
    const at = Math.min(e.last + this.#o.settleMs, e.first + this.#o.maxWaitMs);
    e.timer = setTimeout(() => void this.#start(path, e), Math.max(0, at - Date.now()));
  }

  #start(path: string, e: Entry): Promise<void> {
    e.timer = undefined;
    e.again = false;
    e.busy = true;
    const seen = e.touches;
    const quiet = e.previous === seen;
    e.previous = seen;
    const run = async () => {
      let result: SettleResult = 'done';
      try {
        result = await this.#o.read(path, () => e.touches === seen, quiet);
      } catch (err) {
        this.#o.onError(path, err);
      }
      e.running = undefined;
      e.busy = false;
      if (this.#closed) return;
      const now = Date.now();
      if (e.touches !== seen || e.again) {
        e.first = now;
        this.#schedule(path, e);
      } else if (result === 'confirm') {
        e.first = now;
        e.last = now;
        this.#schedule(path, e);
      } else {
        this.#entries.delete(path);
      }
    };
    e.running = run();
    return e.running;
  }
}
