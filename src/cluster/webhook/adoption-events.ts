// The Event that says a VMI's cloud-init volume was not adopted, written by
// the webhook at the VMI's admission, when the VMI has no UID yet. It goes
// to the VM that makes the VMI when there is one (`kubectl describe vm`
// lists Events by the VM's UID), else to the VMI by name (`kubectl get
// events`, `kubectl describe vmi` once it exists: Events without a UID are
// listed by name). Never blocks an answer: sent after it, a few at a time, a
// bounded backlog, failures logged at most once a minute.
import type { Logger } from 'pino';
import type { KubeApi } from '../../kube/api-client.ts';

/** Where the webhook's Events go; record() never throws and never waits. */
export interface AdoptionEvents {
  skipped(vmi: unknown, namespace: string, message: string): void;
  // Pending writes done (tests, shutdown).
  flush(): Promise<void>;
}

const MAX_IN_FLIGHT = 2;
const MAX_BACKLOG = 200;

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(v: unknown): string {
  return typeof v === 'string' ? v : '';
}

interface Involved {
  apiVersion: string;
  kind: string;
  name: string;
  uid?: string;
}

// The VM controlling the VMI, else the VMI by name (its generateName when it has none yet).
function involved(vmi: unknown): Involved | undefined {
  const meta = isObject(vmi) && isObject(vmi.metadata) ? vmi.metadata : {};
  const owners = Array.isArray(meta.ownerReferences) ? meta.ownerReferences : [];
  const vm = owners.find(
    (o): o is Json => isObject(o) && o.kind === 'VirtualMachine' && o.controller === true && str(o.name) !== '',
  );
  if (vm)
    return {
      apiVersion: str(vm.apiVersion) || 'kubevirt.io/v1',
      kind: 'VirtualMachine',
      name: str(vm.name),
      uid: str(vm.uid),
    };
  const name = str(meta.name) || str(meta.generateName);
  return name === '' ? undefined : { apiVersion: 'kubevirt.io/v1', kind: 'VirtualMachineInstance', name };
}

/** Writes the webhook's Events with the cluster component's credentials. */
export class KubeAdoptionEvents implements AdoptionEvents {
  readonly #api: KubeApi;
  readonly #log: Logger;
  readonly #host: string;
  readonly #backlog: Array<{ namespace: string; object: Involved; message: string }> = [];
  #inFlight = 0;
  #lastNanos = 0n;
  #lastLog = -Infinity;
  #waiters: Array<() => void> = [];

  constructor(options: { api: KubeApi; logger: Logger; host: string }) {
    this.#api = options.api;
    this.#log = options.logger;
    this.#host = options.host;
  }

  skipped(vmi: unknown, namespace: string, message: string): void {
    const object = involved(vmi);
    if (!object) return;
    if (this.#backlog.length >= MAX_BACKLOG) this.#backlog.shift();
    this.#backlog.push({ namespace, object, message });
    this.#pump();
  }

  flush(): Promise<void> {
    if (this.#inFlight === 0 && this.#backlog.length === 0) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  #pump(): void {
    while (this.#inFlight < MAX_IN_FLIGHT && this.#backlog.length > 0) {
      const e = this.#backlog.shift()!;
      this.#inFlight++;
      void this.#send(e.namespace, e.object, e.message)
        .catch((err: unknown) => {
          const now = performance.now();
          if (now - this.#lastLog < 60_000) return;
          this.#lastLog = now;
          this.#log.warn(
            { err: { message: (err as Error).message }, namespace: e.namespace },
            'could not record Event',
          );
        })
        .finally(() => {
          this.#inFlight--;
          this.#pump();
          if (this.#inFlight === 0 && this.#backlog.length === 0) for (const w of this.#waiters.splice(0)) w();
        });
    }
  }

  async #send(namespace: string, object: Involved, message: string): Promise<void> {
    const at = new Date();
    // client-go's "<object>.<nanoseconds in hex>", kept increasing (ours has milliseconds).
    let nanos = BigInt(at.getTime()) * 1_000_000n;
    if (nanos <= this.#lastNanos) nanos = this.#lastNanos + 1n;
    this.#lastNanos = nanos;
    const ts = at.toISOString().replace(/\.\d+Z$/, 'Z');
    const event = {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name: `${object.name}.${nanos.toString(16)}`, namespace },
      involvedObject: { ...object, namespace },
      reason: 'SeedWarning',
      message,
      type: 'Warning',
      count: 1,
      firstTimestamp: ts,
      lastTimestamp: ts,
      source: { component: 'vmseed-webhook', host: this.#host },
      reportingComponent: 'vmseed-webhook',
      reportingInstance: this.#host,
    };
    const res = await this.#api.request('POST', `/api/v1/namespaces/${encodeURIComponent(namespace)}/events`, event);
    if (res.status !== 201 && res.status !== 200 && res.status !== 409)
      throw new Error(`POST Event answered ${res.status}`);
  }
}
