// One watch request, bounded the way client-go's reflector bounds it
// (k8s.io/client-go/tools/cache/reflector.go): `timeoutSeconds` chosen at
// random in [minWatchTimeout, 2*minWatchTimeout] so that the API server ends
// the watch cleanly and the agents of a fleet do not renew in step, and
// `allowWatchBookmarks`. When the stream runs past that timeout plus a grace
// (a server or proxy that never ends it), the watch is cut here and reported
// as a TimeoutError, which ListWatch (list-watch.ts) answers by watching
// again from its last resourceVersion (no relist).
//
// client-node's Watch is not used: its inactivity timer is private
// (`requestTimeoutMs`) and would renew a quiet watch every 30 s.
import { fetch } from 'undici';
import type { KubeConnection } from './connection.ts';
import { retryAfterMs, statusMessage } from './api-client.ts';

/** Receives each watch event: its type (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR), object, and the whole event. */
export type WatchCallback = (phase: string, apiObj: unknown, watchObj?: unknown) => void;
/**
 * Called once when a watch ends: null for a clean end, else the error (a
 * WatchError for a status). Not called after the caller's own abort().
 */
export type DoneCallback = (err: unknown) => void;

/** Bounds of a BoundedWatch; times in milliseconds (grace default 30 s, lines 8 MiB). */
export interface BoundedWatchOptions {
  connection: KubeConnection;
  // client-go's default minWatchTimeout is 5 minutes.
  minWatchTimeoutMs?: number;
  // How long past timeoutSeconds the server may take to end the stream.
  graceMs?: number;
  random?: () => number;
  // One watch event line, at most (a VMI is a few KiB).
  maxLineBytes?: number;
}

/**
 * Errors a watch request ends with; `statusCode` and `code` as ListWatch
 * reads them (410 → relist).
 */
export interface WatchError extends Error {
  statusCode?: number;
  retryAfterMs?: number;
}

/** client-go's default minWatchTimeout: a watch asks to be ended after 5 to 10 minutes. */
export const MIN_WATCH_TIMEOUT_MS = 5 * 60_000;

/**
 * Starts watch requests bounded as the module comment describes; the
 * `watch` method ListWatch expects. watch() reports failures, a non-200
 * answer included, through `done` rather than rejecting.
 */
export class BoundedWatch {
  readonly #conn: KubeConnection;
  readonly #minMs: number;
  readonly #graceMs: number;
  readonly #random: () => number;
  readonly #maxLine: number;

  constructor(options: BoundedWatchOptions) {
    this.#conn = options.connection;
    this.#minMs = options.minWatchTimeoutMs ?? MIN_WATCH_TIMEOUT_MS;
    this.#graceMs = options.graceMs ?? 30_000;
    this.#random = options.random ?? Math.random;
    this.#maxLine = options.maxLineBytes ?? 8 * 1024 * 1024;
  }

  // The timeoutSeconds of the next watch: whole seconds, at least 1.
  nextTimeoutSeconds(): number {
    return Math.max(1, Math.floor((this.#minMs / 1000) * (1 + this.#random())));
  }

  async watch(
    path: string,
    query: Record<string, string>,
    callback: WatchCallback,
    done: DoneCallback,
  ): Promise<{ abort(): void }> {
    const timeoutSeconds = this.nextTimeoutSeconds();
    const url = new URL(this.#conn.getCurrentCluster().server + path);
    for (const [k, v] of Object.entries(query)) url.searchParams.set(k, v);
    url.searchParams.set('watch', 'true');
    url.searchParams.set('allowWatchBookmarks', 'true');
    url.searchParams.set('timeoutSeconds', String(timeoutSeconds));

    const controller = new AbortController();
    let finished = false;
    let abortedByCaller = false;
    const finish = (err: unknown) => {
      clearTimeout(deadline);
      if (finished) return;
      finished = true;
      controller.abort();
      if (!abortedByCaller) done(err);
    };
    const deadline = setTimeout(
      () => {
        const e = new Error(
          `watch ran ${timeoutSeconds}s + ${this.#graceMs}ms without the server ending it`,
        ) as WatchError;
        e.name = 'TimeoutError';
        finish(e);
      },
      timeoutSeconds * 1000 + this.#graceMs,
    );
    deadline.unref();
    const handle = {
      abort: () => {
        abortedByCaller = true;
        finish(null);
      },
    };

    let res;
    try {
      res = await fetch(url, {
        headers: { ...this.#conn.authHeaders(), accept: 'application/json' },
        dispatcher: this.#conn.dispatcher,
        signal: controller.signal,
      });
    } catch (e) {
      finish(e);
      return handle;
    }
    if (res.status !== 200) {
      const text = await res.text().catch(() => '');
      let message = '';
      try {
        message = statusMessage(JSON.parse(text));
      } catch {
        // not a Status
      }
      const e = new Error(`watch answered ${res.status}${message ? `: ${message.slice(0, 200)}` : ''}`) as WatchError;
      e.statusCode = res.status;
      const after = retryAfterMs(res.headers.get('retry-after'));
      if (after !== undefined) e.retryAfterMs = after;
      if (res.status === 401) this.#conn.tokenRejected();
      finish(e);
      return handle;
    }
    void this.#read(res.body, callback, () => finished).then(
      () => finish(null),
      (e: unknown) => finish(e),
    );
    return handle;
  }

  // JSON lines until the server ends the stream; a line over the budget
  // ends the watch with an error (the informer restarts it). Each chunk is
  // searched once and a line decoded once when complete: a Secret of 1 MiB
  // arrives as a line of ~1.4 MiB in dozens of chunks, and searching the
  // whole pending text again at each chunk would cost seconds of CPU.
  async #read(body: ReadableStream<Uint8Array> | null, callback: WatchCallback, stopped: () => boolean): Promise<void> {
    if (!body) return;
    const decoder = new TextDecoder();
    let pending: Uint8Array[] = [];
    let pendingBytes = 0;
    const take = (tail: Uint8Array): Uint8Array => {
      const line = pendingBytes === 0 ? tail : Buffer.concat([...pending, tail]);
      pending = [];
      pendingBytes = 0;
      if (line.length > this.#maxLine) throw new Error(`watch event over ${this.#maxLine} bytes`);
      return line;
    };
    for await (const chunk of body) {
      if (stopped()) return;
      let start = 0;
      // A newline byte never occurs inside a multi-byte UTF-8 character.
      for (let nl = chunk.indexOf(0x0a); nl >= 0; nl = chunk.indexOf(0x0a, start)) {
        const line = decoder.decode(take(chunk.subarray(start, nl)));
        start = nl + 1;
        if (line.trim() !== '') this.#emit(line, callback);
        if (stopped()) return;
      }
      if (start < chunk.length) {
        pending.push(chunk.subarray(start));
        pendingBytes += chunk.length - start;
      }
      if (pendingBytes > this.#maxLine) throw new Error(`watch event over ${this.#maxLine} bytes`);
    }
    if (pendingBytes === 0 || stopped()) return;
    const rest = decoder.decode(take(new Uint8Array(0)));
    if (rest.trim() !== '') this.#emit(rest, callback);
  }

  #emit(line: string, callback: WatchCallback): void {
    let event: { type?: string; object?: unknown };
    try {
      event = JSON.parse(line) as { type?: string; object?: unknown };
    } catch {
      return; // as client-node: a line that is not JSON is skipped
    }
    if (typeof event.type === 'string') callback(event.type, event.object, event);
  }
}
