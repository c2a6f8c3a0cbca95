// A VMI whose domain is not there yet (not defined, not started, its
// launcher's libvirt not answering) is retried with backoff. With libvirt's
// domain events it need not wait for the backoff: the agent watches the
// libvirt that will hold the domain and enqueues the VMI the moment its
// domain is defined or started. The backoff stays as the fallback (events
// lost while a connection was down are covered by a re-run on reconnect).
import type { Logger } from 'pino';
import { isVmseedError } from '../../errors.ts';
import type { InjectionTarget, Injector } from '../../libvirt/injector-contract.ts';
import { domainId, type LibvirtEvent } from '../../libvirt/libvirt-client.ts';

/**
 * The libvirt domain events DomainWaits listens to (AgentOptions.domainEvents);
 * clientDomainEvents makes one from the RPC client.
 */
export interface DomainEvents {
  // `domain` undefined: the connection to `uri` came (back) up; events may
  // have been missed.
  subscribe(listener: (uri: string, domain: string | undefined, event: string) => void): () => void;
  // Keeps `uri` connected, its events flowing, until the returned function
  // is called.
  watch(uri: string): () => void;
  // Where a VMI's domain lives (the injector's URI and domain-name
  // templates); throws when that is not known yet (no launcher pod).
  locate(target: InjectionTarget): { uri: string; domain: string };
  // Watched for the agent's whole life (plain libvirt: the one host URI).
  alwaysWatch?: string[];
}

// Failures that mean "the domain is not there (yet)".
const WAITING = new Set([
  'DOMAIN_NOT_FOUND',
  'DOMAIN_STATE_UNSUPPORTED',
  'LIBVIRT_UNREACHABLE',
  'LIBVIRT_CONNECTION_LOST',
]);
// A domain appearing: defined, started (paused or not), paused.
const APPEARING = new Set(['defined', 'started', 'suspended']);

interface Tracked {
  id: string;
  uri: string;
  unwatch: (() => void) | undefined;
}

/**
 * Enqueues a VMI the moment its awaited domain appears instead of after its
 * backoff: wrap() the injector, and an inject that fails for want of the domain
 * watches that domain's libvirt until it is defined or started.
 */
export class DomainWaits {
  readonly #events: DomainEvents;
  readonly #enqueue: (key: string) => void;
  readonly #log: Logger;
  // VMI key -> its domain, while an injection runs or waits for the domain.
  readonly #byKey = new Map<string, Tracked>();
  readonly #byDomain = new Map<string, Set<string>>();
  readonly #always: Array<() => void> = [];
  // The wrapped injector: an attach it sends from a start event goes first.
  #inner: Injector | undefined;
  #unsubscribe: (() => void) | undefined;

  constructor(events: DomainEvents, enqueue: (key: string) => void, logger: Logger) {
    this.#events = events;
    this.#enqueue = enqueue;
    this.#log = logger;
  }

  start(): void {
    if (this.#unsubscribe) return;
    this.#unsubscribe = this.#events.subscribe((uri, domain, event) => this.#onEvent(uri, domain, event));
    for (const uri of this.#events.alwaysWatch ?? []) this.#always.push(this.#events.watch(uri));
  }

  stop(): void {
    this.#unsubscribe?.();
    this.#unsubscribe = undefined;
    for (const unwatch of this.#always.splice(0)) unwatch();
    for (const key of [...this.#byKey.keys()]) this.#release(key);
  }

  /** The VMI ended: its domain is not awaited any more. */
  forget(key: string): void {
    this.#release(key);
  }

  /** Whether the VMI's domain is tracked. */
  holds(key: string): boolean {
    if (this.#byKey.has(key)) return true;
    for (const keys of this.#byDomain.values()) if (keys.has(key)) return true;
    return false;
  }

  // Keys whose domain is awaited (tests, status).
  get waiting(): string[] {
    return [...this.#byKey].filter(([, t]) => t.unwatch !== undefined).map(([k]) => k);
  }

  #onEvent(uri: string, domain: string | undefined, event: string): void {
    if (domain === undefined) {
      const keys = [...this.#byKey].filter(([, t]) => t.uri === uri && t.unwatch !== undefined).map(([k]) => k);
      this.#enqueueAll(keys, domain, event);
      return;
    }
    if (!APPEARING.has(event)) return;
    // The seed's attach sent from this start event (prepared-attach.ts): the
    // reconcile waits for libvirt's answer, then finds it done. Run at once,
    // its render and image build would hold the event loop while the attach
    // is sent and its answer read.
    const enqueue = () => this.#enqueueAll([...(this.#byDomain.get(domainId(uri, domain)) ?? [])], domain, event);
    const sending = this.#inner?.attachingAtStart?.(uri, domain);
    if (!sending) return enqueue();
    void sending.then(() => {
      if (this.#unsubscribe) enqueue();
    });
  }

  #enqueueAll(keys: string[], domain: string | undefined, event: string): void {
    for (const key of keys) {
      this.#log.debug(
        { key, domain, event: domain === undefined ? 'reconnected' : event },
        'libvirt event: reconcile now',
      );
      this.#enqueue(key);
    }
  }

  // Known before the call: an event that comes while it runs re-runs the
  // VMI right after it (the work queue's dirty mark), so a domain defined
  // between our lookup and the failure is not left to the backoff.
  #track(key: string, uri: string, domain: string): Tracked {
    const id = domainId(uri, domain);
    const had = this.#byKey.get(key);
    if (had?.id === id) return had;
    if (had) this.#release(key);
    const t: Tracked = { id, uri, unwatch: undefined };
    this.#byKey.set(key, t);
    let keys = this.#byDomain.get(id);
    if (!keys) this.#byDomain.set(id, (keys = new Set()));
    keys.add(key);
    return t;
  }

  #release(key: string): void {
    const t = this.#byKey.get(key);
    if (!t) return;
    this.#byKey.delete(key);
    t.unwatch?.();
    const keys = this.#byDomain.get(t.id);
    keys?.delete(key);
    if (keys?.size === 0) this.#byDomain.delete(t.id);
  }

  wrap(inner: Injector): Injector {
    this.#inner = inner;
    const outer: Injector = {
      ...(inner.perPod !== undefined ? { perPod: inner.perPod } : {}),
      ...(inner.stage ? { stage: inner.stage.bind(inner) } : {}),
      ...(inner.unstage ? { unstage: inner.unstage.bind(inner) } : {}),
      ...(inner.activeDomainPods ? { activeDomainPods: inner.activeDomainPods.bind(inner) } : {}),
      ...(inner.domainDevices ? { domainDevices: inner.domainDevices.bind(inner) } : {}),
      inject: async (target, imagePath, options) => {
        const key = `${target.namespace}/${target.name}`;
        let where: { uri: string; domain: string } | undefined;
        try {
          where = this.#events.locate(target);
        } catch {
          // No launcher pod yet: the VMI's own update brings it.
          this.#release(key);
        }
        const t = where ? this.#track(key, where.uri, where.domain) : undefined;
        try {
          const r = await inner.inject(target, imagePath, options);
          this.#release(key);
          return r;
        } catch (e) {
          if (t && this.#byKey.get(key) === t && isVmseedError(e) && WAITING.has(e.code)) {
            try {
              t.unwatch ??= this.#events.watch(t.uri);
            } catch {
              // Too many sockets open: the backoff alone brings the retry.
            }
          } else {
            this.#release(key);
          }
          throw e;
        }
      },
      eject: async (target, options) => {
        this.#release(`${target.namespace}/${target.name}`);
        return inner.eject(target, options);
      },
    };
    return outer;
  }
}

/** DomainEvents from a LibvirtClient that has them (the RPC client). */
export function clientDomainEvents(
  client: { onEvent(l: (e: LibvirtEvent) => void): () => void; watch(uri: string): () => void },
  locate: DomainEvents['locate'],
  alwaysWatch: string[] = [],
): DomainEvents {
  return {
    subscribe: (listener) =>
      client.onEvent((e) => {
        if (e.type === 'lifecycle') listener(e.uri, e.domain, e.event);
        else if (e.type === 'connection' && e.state === 'up') listener(e.uri, undefined, 'connected');
      }),
    watch: (uri) => client.watch(uri),
    locate,
    alwaysWatch,
  };
}
