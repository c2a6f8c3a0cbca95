// Where VMIs come from: the Kubernetes informer or a local directory. Both
// keep a cache the reconciler reads by key and call `onKey` for every key
// that may have changed. `onKey` only enqueues.
import type { VmiObject } from '../api/objects.ts';
import type { WatchStatus } from '../status/snapshot.ts';

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

export type KeyHandler = (key: string) => void;

export function keyOf(obj: { metadata: { namespace?: string; name: string } }): string {
  return `${obj.metadata.namespace ?? ''}/${obj.metadata.name}`;
}
