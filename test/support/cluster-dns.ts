// Cluster DNS for the kubelet stand-in's pods (kubelet.ts): the records of
// `<service>.<namespace>.svc` are the IPs of the Ready pods each Service of
// the fake API server selects, as CoreDNS answers a headless Service (a
// ClusterIP Service's virtual address and kube-proxy are not replicated:
// the name leads straight to a Ready endpoint). Readiness is each pod's own
// readiness probes (every container's, as the endpoints controller goes by
// the pod's Ready condition), polled; the records are written to a
// directory the pods' containers mount, where cluster-dns-preload.ts reads
// them. One per fake API server, shared by the pods started against it.
import { mkdtemp, rename, rm, writeFile, chmod } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FakeKube } from './fake-kube.ts';

type Any = any;

export interface DnsPod {
  namespace: string;
  labels: Record<string, string>;
  podIP: string;
  // The URLs of the containers' readiness probes (none: Ready once running).
  readinessUrls: string[];
}

export class ClusterDns {
  readonly dir: string;
  readonly #fake: FakeKube;
  readonly #pods = new Map<DnsPod, boolean>();
  #timer: NodeJS.Timeout | undefined;
  #written = '';
  #polling: Promise<void> | undefined;
  // Writes one at a time (a poll's and a pod's removal), none once closed.
  #writing: Promise<void> = Promise.resolve();
  #closed = false;

  private constructor(fake: FakeKube, dir: string) {
    this.#fake = fake;
    this.dir = dir;
  }

  static async create(fake: FakeKube): Promise<ClusterDns> {
    const dir = await mkdtemp(join(tmpdir(), 'vmseed-cluster-dns-'));
    await chmod(dir, 0o755);
    const dns = new ClusterDns(fake, dir);
    await dns.#write();
    return dns;
  }

  add(pod: DnsPod): void {
    this.#pods.set(pod, false);
    this.#timer ??= setInterval(() => void this.poll(), 250).unref();
  }

  remove(pod: DnsPod): Promise<void> {
    this.#pods.delete(pod);
    return this.#write();
  }

  // Probe every pod once and rewrite the records.
  poll(): Promise<void> {
    this.#polling ??= (async () => {
      for (const pod of this.#pods.keys()) {
        let ready = true;
        for (const url of pod.readinessUrls)
          ready &&= await fetch(url, { signal: AbortSignal.timeout(1000) }).then(
            (r) => (void r.body?.cancel(), r.status >= 200 && r.status < 400),
            () => false,
          );
        if (this.#pods.has(pod)) this.#pods.set(pod, ready);
      }
      await this.#write();
    })().finally(() => (this.#polling = undefined));
    return this.#polling;
  }

  // The current records: `<service>.<namespace>.svc` → Ready pod IPs.
  records(): Record<string, string[]> {
    const out: Record<string, string[]> = {};
    for (const svc of this.#fake.objects.all().filter((o) => o.kind === 'Service') as Any[]) {
      const selector: Record<string, string> = svc.spec?.selector ?? {};
      if (Object.keys(selector).length === 0) continue;
      const ips = [...this.#pods]
        .filter(([, ready]) => ready || svc.spec.publishNotReadyAddresses === true)
        .map(([p]) => p)
        .filter((p) => p.namespace === svc.metadata.namespace)
        .filter((p) => Object.entries(selector).every(([k, v]) => p.labels[k] === v))
        .map((p) => p.podIP);
      if (ips.length > 0) out[`${svc.metadata.name}.${svc.metadata.namespace}.svc`] = ips;
    }
    return out;
  }

  #write(): Promise<void> {
    this.#writing = this.#writing.then(async () => {
      const text = JSON.stringify(this.records());
      if (this.#closed || text === this.#written) return;
      const file = join(this.dir, 'hosts.json');
      await writeFile(`${file}.tmp`, text, { mode: 0o644 });
      await chmod(`${file}.tmp`, 0o644);
      await rename(`${file}.tmp`, file);
      this.#written = text;
    });
    return this.#writing;
  }

  async close(): Promise<void> {
    clearInterval(this.#timer);
    this.#closed = true;
    await this.#polling;
    await this.#writing.catch(() => {});
    await rm(this.dir, { recursive: true, force: true });
  }
}

const perFake = new WeakMap<FakeKube, { dns: Promise<ClusterDns>; pods: number }>();

// The fake API server's cluster DNS; each pod takes one reference, and
// the last pod's release removes it.
export async function clusterDnsOf(fake: FakeKube): Promise<{ dns: ClusterDns; release(): Promise<void> }> {
  let entry = perFake.get(fake);
  if (!entry) perFake.set(fake, (entry = { dns: ClusterDns.create(fake), pods: 0 }));
  entry.pods++;
  const dns = await entry.dns;
  let released = false;
  return {
    dns,
    release: async () => {
      if (released) return;
      released = true;
      if (--entry.pods === 0) {
        perFake.delete(fake);
        await dns.close();
      }
    },
  };
}
