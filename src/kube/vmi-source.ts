// Where VMIs come from: the Kubernetes informer or a local directory. Both
// keep a cache the reconciler reads by key and call `onKey` for every key
// that may have changed. `onKey` only enqueues.
import type { VmiObject } from '../api/objects.ts';
import type { WatchStatus } from '../status/snapshot.ts';

/**
 * A cache of the node's VMIs by `namespace/name` key (keyOf), filled from
 * the API server or a local directory; changes are announced by key only.
 */
export interface VmiSource {
  start(): Promise<void>;
  stop(): Promise<void>;
  get(key: string): VmiObject | undefined;
  keys(): string[];
  // Resolves after the first full list (or directory scan) is in the cache.
  synced(): Promise<void>;
  status(): WatchStatus;
  // The periodic resync: read the source again where events may be lost
  // (local mode's files); what changed is reported through `onKey`.
  resync?(): void;
}

/** Called with every key that may have changed; it only enqueues, never reconciles. */
export type KeyHandler = (key: string) => void;

/** An object's cache and work-queue key: `namespace/name` (an empty namespace for none). */
export function keyOf(obj: { metadata: { namespace?: string; name: string } }): string {
  return `${obj.metadata.namespace ?? ''}/${obj.metadata.name}`;
}
