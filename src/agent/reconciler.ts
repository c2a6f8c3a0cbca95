// Level-based reconcile of one VMI key: read the latest object from the
// cache and make the world match it. Ours and here: render, build, write
// (skipped when the content hash is unchanged), inject (skipped when this
// hash is already injected), then prune the VMI's older images. Image paths
// are content-addressed (see src/disk/store.ts): a new seed is a new path, so
// the injector, comparing the domain's source path with ours, replaces the
// disk, also after a restart that lost what was injected. Gone, moved,
// Succeeded or Failed: detach and remove. Running it twice does nothing the
// second time.
import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import { devicesNeedingDomain } from '../cloudinit/devices-metadata.ts';
import type { DomainFacts } from '../libvirt/domain-devices.ts';
import { withHostNuma, type HostNumaReader } from '../libvirt/host-numa.ts';
import type { RefResolver, VmiObject } from '../api/types.ts';
import type { Datasource, Seed } from '../cloudinit/seed.ts';
import { seedTimestamp } from '../cloudinit/timestamp.ts';
import { releaseImageBytes } from '../disk/seed-image.ts';
import { asVmseedError, VmseedError } from '../errors.ts';
import type { InjectionTarget, Injector } from '../libvirt/types.ts';
import {
  launcherPodOf,
  launcherPodsOnNode,
  migrationInProgress,
  migrationStateOf,
  planLaunchers,
  type LauncherPlan,
} from '../libvirt/launcher-pod.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { AgentRenderOptions, BuildSeedImage, RenderSeed, SeedImageStore, StoredImage } from './deps.ts';
import type { EventRecorder } from './events.ts';
import type { StatusStore } from './status-store.ts';
import type { WorkResult } from './work-queue.ts';
import { splitKey } from './status-store.ts';
import { formatSeconds } from '../format.ts';

export interface ReconcilerOptions {
  nodeName: string;
  cache: { get(key: string): VmiObject | undefined };
  refs: RefResolver;
  render: RenderSeed;
  build: BuildSeedImage;
  store: SeedImageStore;
  injector?: Injector;
  events: EventRecorder;
  status: StatusStore;
  metrics?: Metrics;
  logger: Logger;
  renderOptions: AgentRenderOptions;
  fsync?: boolean;
  // The NoCloud HTTP datasource's seeds: put when the image is on disk,
  // dropped when it is removed.
  seeds?: { put(key: string, vmi: VmiObject, seed: Seed): void; drop(key: string): void };
  // Failed attempts so far for a key (the queue's count), for the status page.
  failures?: (key: string) => number;
  now?: () => number;
  // The first park after MAX_RENDER_TIMEOUTS (default RENDER_TIMEOUT_PARK_MS).
  renderTimeoutParkMs?: number;
  // Local mode: a VMI labelled for another node is shown as skipped with the
  // reason and logged once, not silently dropped (a manifest copied from a
  // cluster keeps its kubevirt.io/nodeName label).
  reportOtherNodes?: boolean;
  // Host devices' NUMA node and CPUs (ConfigDrive `devices`), read when a
  // VMI's domain is read for its tagged devices.
  hostNuma?: HostNumaReader;
}

// What is on disk (and in the domain) for a key.
interface Known {
  uid: string;
  datasource: Datasource | undefined;
  path: string;
  sha256: string;
  injectedSha?: string;
  // The VMI's directory may hold other images (older seeds, what was there
  // at start-up): prune() clears it once path is in use. Set after every
  // write (one readdir) and when start-up found several.
  needsPrune: boolean;
  annotations: Record<string, string>;
  // The launcher pods last seen for it: eject still reaches the domain
  // after the VMI object is gone.
  launcherPods: string[];
  // KubeVirt: the launcher pod whose domain got the disk, and migration
  // targets that got the image only.
  attachedPod?: string;
  stagedPods?: string[];
}

// An INTERNAL error is a bug or an input nothing else caught: retried this
// many times in all (the backoff spaces them), then reported terminal, so a
// poisoned object cannot keep the agent busy for ever. A change to the
// object tries again.
export const MAX_INTERNAL_ATTEMPTS = 5;

// A render step that ran out of the render worker's deadline cost the worker
// all of it, and a restart. The same version of a VMI gets that this many
// times, then is reported terminal and parked until the VMI changes or the
// park ends (RENDER_TIMEOUT_PARK_MS, doubled at each further timeout, at most
// a day): a tenant's document cannot keep the worker busy, and a legitimate
// one that timed out because the node starved the agent of CPU (a busy VM
// node gives it its 50m request) is seeded once the node has CPU again,
// without anyone editing the VMI. The count is per version, so failures of
// other kinds before it (a launcher not up yet) do not shorten it.
// (RENDER_WORKER_FAILED stays retryable: a worker that did not start is the
// node's state, not the VMI's.)
export const MAX_RENDER_TIMEOUTS = 3;
export const RENDER_TIMEOUT_PARK_MS = 60 * 60_000;
const MAX_RENDER_TIMEOUT_PARK_MS = 24 * 60 * 60_000;

export function nodeOf(vmi: VmiObject): string | undefined {
  return vmi.status?.nodeName || vmi.metadata.labels?.['kubevirt.io/nodeName'] || undefined;
}

export function sha256Hex(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

export class Reconciler {
  readonly #o: ReconcilerOptions;
  readonly #log: Logger;
  readonly #known = new Map<string, Known>();
  // key -> uid and when this agent first saw it (seed-ready latency).
  readonly #firstSeen = new Map<string, { uid: string; at: number; reported: boolean }>();
  // key -> the other node it was last logged for (log once per change).
  readonly #otherNodeLogged = new Map<string, string>();
  // key -> the domain facts read for its tagged devices, per VMI uid: read
  // once, so a device hot-plugged later never changes the seed under the
  // running guest (KubeVirt builds its drive once, at start).
  readonly #domainFactsRead = new Map<string, { uid: string; facts: DomainFacts }>();
  // key -> RENDER_TIMEOUTs of the VMI's current version.
  readonly #renderTimeouts = new Map<string, { version: string | undefined; count: number }>();

  constructor(options: ReconcilerOptions) {
    this.#o = options;
    this.#log = options.logger;
  }

  #now(): number {
    return this.#o.now ? this.#o.now() : Date.now();
  }

  // Is this VMI one this agent should have a seed for (if vmseed's)?
  isHere(vmi: VmiObject): boolean {
    const phase = vmi.status?.phase;
    if (phase === 'Succeeded' || phase === 'Failed') return false;
    const node = nodeOf(vmi);
    if (node === undefined || node === this.#o.nodeName) return true;
    // Migrating to this node: its target pod needs the image before QEMU
    // there opens it (status.nodeName changes only when the migration ends).
    const m = migrationStateOf(vmi.status);
    return migrationInProgress(m) && m.targetNode === this.#o.nodeName;
  }

  // Start-up, after the first full list: images of VMIs that are not here
  // any more are detached and removed; the rest are remembered with the hash
  // of what is on disk, so a correct image is not rewritten. Its disk is not
  // re-attached either: the first reconcile calls inject(), which finds our
  // disk (same content-addressed path) already in the domain and reports
  // `none`. A VMI with several images (a crash between write and prune)
  // keeps them all here: the first reconcile decides which one is wanted,
  // injects it and prunes the others.
  async collectGarbage(): Promise<{ kept: number; removed: number }> {
    await this.#o.store.cleanupTemporaries();
    const images = await this.#o.store.list();
    let kept = 0;
    let removed = 0;
    const removedVmis = new Set<string>();
    for (const img of images) {
      const key = `${img.namespace}/${img.name}`;
      const live = this.#o.cache.get(key);
      if (live && live.metadata.uid === img.uid && this.isHere(live)) {
        const had = this.#known.get(key);
        const sha = await this.#o.store.hashImage(img.path);
        if (sha !== undefined) {
          // Several images (a crash between write and prune): all stay, the
          // first reconcile decides. An image whose content matches its name
          // is preferred as the one on record.
          if (had) {
            had.needsPrune = true;
            if (!sha.startsWith(img.sha16)) {
              kept++;
              continue;
            }
          }
          this.#known.set(key, {
            uid: img.uid,
            datasource: img.datasource,
            path: img.path,
            sha256: sha,
            needsPrune: had !== undefined,
            annotations: live.metadata.annotations ?? {},
            launcherPods: launcherPodsOnNode(live.status?.activePods, this.#o.nodeName),
          });
          kept++;
          continue;
        }
      }
      // remove() takes all of the VMI's images at once.
      if (removedVmis.has(`${key}\0${img.uid}`)) continue;
      removedVmis.add(`${key}\0${img.uid}`);
      try {
        await this.#removeImage(
          key,
          img,
          live?.metadata.annotations ?? {},
          live ? launcherPodsOnNode(live.status?.activePods, this.#o.nodeName) : [],
        );
        removed++;
      } catch (e) {
        const err = asVmseedError(e);
        this.#log.warn(
          { namespace: img.namespace, name: img.name, code: err.code },
          `garbage collection failed: ${err.message}`,
        );
      }
    }
    this.#log.info({ kept, removed }, 'garbage collection of seed images done');
    return { kept, removed };
  }

  async reconcile(key: string): Promise<WorkResult> {
    const started = performance.now();
    const vmi = this.#o.cache.get(key);
    // A failure after the image was written (injection) is not a failed
    // generation: the histogram has its success observation already.
    const progress = { generated: false };
    try {
      if (!vmi || !this.isHere(vmi)) {
        await this.#cleanup(key);
        const other = vmi && this.#o.reportOtherNodes ? nodeOf(vmi) : undefined;
        if (vmi && other !== undefined && other !== this.#o.nodeName) this.#skipOtherNode(key, vmi, other);
        else {
          this.#o.status.remove(key);
          this.#otherNodeLogged.delete(key);
        }
        this.#firstSeen.delete(key);
        this.#domainFactsRead.delete(key);
        this.#renderTimeouts.delete(key);
        this.#o.metrics?.reconcileTotal.inc({ result: 'success' });
        return 'success';
      }
      const result = await this.#ensure(key, vmi, started, progress);
      this.#renderTimeouts.delete(key);
      return result;
    } catch (e) {
      return this.#failed(key, vmi, e, started, progress);
    }
  }

  #skipOtherNode(key: string, vmi: VmiObject, node: string): void {
    const message =
      `the VMI names node "${node}" (${vmi.status?.nodeName ? 'status.nodeName' : 'label kubevirt.io/nodeName'}) and this agent is ` +
      `--node-name "${this.#o.nodeName}"; remove the label from the manifest or start the agent with --node-name ${node}`;
    this.#o.status.update(key, vmi.metadata.uid ?? key, {
      state: 'skipped',
      warnings: [
        this.#o.status.problem('VMI_ON_OTHER_NODE', message, {
          field: vmi.status?.nodeName ? 'status.nodeName' : 'metadata.labels.kubevirt.io/nodeName',
        }),
      ],
      lastError: undefined,
      retries: 0,
      datasource: undefined,
      imagePath: undefined,
    });
    if (this.#otherNodeLogged.get(key) !== node) {
      this.#otherNodeLogged.set(key, node);
      const [namespace, name] = key.split('/');
      this.#log.warn({ namespace, name, node, agentNode: this.#o.nodeName }, `skipped: ${message}`);
    }
  }

  async #ensure(key: string, vmi: VmiObject, started: number, progress: { generated: boolean }): Promise<WorkResult> {
    this.#otherNodeLogged.delete(key);
    const uid = vmi.metadata.uid ?? key;
    const seen = this.#firstSeen.get(key);
    if (!seen || seen.uid !== uid) this.#firstSeen.set(key, { uid, at: this.#now(), reported: false });
    const known = this.#known.get(key);
    if (known && known.uid !== uid) await this.#cleanup(key); // same name, new object

    let outcome = await this.#o.render(vmi, this.#o.refs, this.#o.renderOptions);
    if (outcome.kind === 'seed' && outcome.seed.datasource === 'configdrive') {
      const facts = await this.#domainFacts(key, uid, vmi);
      if (facts) {
        const domainDevices = this.#o.hostNuma ? await withHostNuma(facts.devices, this.#o.hostNuma) : facts.devices;
        outcome = await this.#o.render(vmi, this.#o.refs, this.#o.renderOptions, {
          domainDevices,
          vcpuPins: facts.vcpuPins,
        });
      }
    }
    if (outcome.kind === 'skip') {
      await this.#cleanup(key);
      const warnings = outcome.warning
        ? [this.#o.status.problem(outcome.warning.code, outcome.warning.message, { field: outcome.warning.field })]
        : [];
      this.#o.status.update(key, uid, {
        state: 'skipped',
        warnings,
        lastError: undefined,
        retries: 0,
        datasource: undefined,
        imagePath: undefined,
      });
      if (outcome.warning)
        this.#o.events.record(vmi, 'Warning', 'SeedWarning', `${outcome.warning.code}: ${outcome.warning.message}`);
      this.#o.metrics?.reconcileTotal.inc({ result: 'success' });
      return 'success';
    }
    const seed = outcome.seed;
    if (seed.delivery === 'http') return this.#ensureHttpOnly(key, vmi, uid, seed);
    // Rendering and building are each one synchronous stretch: let the
    // event loop run between them.
    await new Promise<void>((resolve) => setImmediate(resolve));
    const buildStart = performance.now();
    const image = this.#o.build(seed, seedTimestamp(vmi));
    this.#o.metrics?.imageBuildDuration.observe(
      { datasource: seed.datasource },
      (performance.now() - buildStart) / 1000,
    );
    const sha = image.sha256;
    const size = image.bytes.length;
    const target = injectionTarget(key, uid, seed.datasource, vmi, this.#o.nodeName);
    let entry = this.#known.get(key);
    let written = false;
    // Level-based down to the file: an image deleted behind our back is written again.
    const onDisk =
      entry !== undefined && entry.sha256 === sha && (await this.#o.store.imageStat(entry.path))?.size === size;
    if (!entry || !onDisk || entry.datasource !== seed.datasource) {
      if (entry && entry.datasource !== undefined && entry.datasource !== seed.datasource) await this.#cleanup(key);
      const res = await this.#o.store.write(
        { namespace: target.namespace, name: target.name, uid },
        seed.datasource,
        image.bytes,
        { fsync: this.#o.fsync ?? true, sha256: sha },
      );
      written = res.written;
      // Where the previous image went stays known (a new seed for the same
      // launcher pods).
      const placed =
        entry?.uid === uid
          ? {
              launcherPods: entry.launcherPods,
              ...(entry.attachedPod ? { attachedPod: entry.attachedPod } : {}),
              stagedPods: entry.stagedPods ?? [],
            }
          : { launcherPods: target.launcherPods ?? [] };
      entry = {
        uid,
        datasource: seed.datasource,
        path: res.path,
        sha256: sha,
        needsPrune: true,
        annotations: target.annotations,
        ...placed,
      };
      this.#known.set(key, entry);
      this.#o.metrics?.imageBytes.observe({ datasource: seed.datasource }, size);
    }
    releaseImageBytes(image.bytes);
    this.#o.seeds?.put(key, vmi, seed);
    const generationSeconds = (performance.now() - started) / 1000;
    if (written) {
      this.#o.metrics?.seedGenerationDuration.observe(
        { datasource: seed.datasource, result: 'success' },
        generationSeconds,
      );
      this.#o.status.recordGeneration(generationSeconds);
    }
    progress.generated = true;

    const warnings = seed.warnings.map((w) => this.#o.status.problem(w.code, w.message, { field: w.field }));
    let injection = this.#o.status.get(key)?.injection;
    let injected = false;
    let staged: string[] = [];
    const injector = this.#o.injector;
    let attach = injector !== undefined;
    if (injector?.perPod) {
      // Which of this node's launcher pods gets the disk, which (migration
      // targets) the image only, and which no longer run the VM.
      const plan = await this.#plan(target, vmi, entry);
      staged = await this.#applyPlan(target, entry, plan);
      attach = plan.attachTo !== undefined;
      if (plan.attachTo !== undefined) target.launcherPods = [plan.attachTo];
      else if (!plan.receiving) launcherPodOf({ ...target, launcherPods: [] }); // LAUNCHER_POD_UNKNOWN, retried
    } else if (!sameList(entry.launcherPods, target.launcherPods ?? [])) {
      // A new launcher pod (the VM restarted or migrated) holds a new domain.
      entry.launcherPods = target.launcherPods ?? [];
      entry.injectedSha = undefined;
    }
    if (injector && attach && entry.injectedSha !== sha) {
      const t0 = performance.now();
      let result;
      try {
        result = await injector.inject(target, entry.path);
      } catch (e) {
        // The domain had one of our images already: this was a replace.
        const operation = this.#o.status.get(key)?.injection ? 'replace' : 'attach';
        this.#o.metrics?.injectionDuration.observe({ operation, result: 'error' }, (performance.now() - t0) / 1000);
        throw e;
      }
      if (result.action !== 'none') {
        this.#o.metrics?.injectionDuration.observe(
          { operation: result.action === 'attached' ? 'attach' : 'replace', result: 'success' },
          (performance.now() - t0) / 1000,
        );
        injected = true;
      }
      entry.injectedSha = sha;
      injection = {
        domain: result.domain,
        targetDev: result.targetDev,
        bus: result.bus,
        flags: result.flags,
        domainState: result.domainState,
        seededAfterBoot: result.seededAfterBoot,
        resumed: result.resumed,
        at: new Date(this.#now()).toISOString(),
      };
    }
    // The domain uses entry.path now (or there is no domain): older images
    // are no one's any more. A failed prune is retried by the next reconcile.
    await this.#prune(target, entry);
    // Kept for as long as the VMI lives, not only on the reconcile that
    // attached: the guest booted without its seed, and that stays true.
    if (injection?.seededAfterBoot) {
      warnings.push(
        this.#o.status.problem(
          'SEEDED_AFTER_BOOT',
          `the seed was attached to running domain ${injection.domain}; the guest may have booted without it`,
        ),
      );
    }

    const prev = this.#o.status.get(key);
    const changed =
      written || injected || !prev || prev.state === 'pending' || prev.state === 'error' || prev.contentHash !== sha;
    const fileTime = written
      ? new Date(this.#now()).toISOString()
      : (prev?.generatedAt ?? (await this.#mtimeIso(entry.path)));
    this.#o.status.update(key, uid, {
      state: warnings.length > 0 ? 'warning' : 'ready',
      datasource: seed.datasource,
      imagePath: entry.path,
      imageBytes: size,
      contentHash: sha,
      generatedAt: fileTime,
      generationSeconds: written ? generationSeconds : (prev?.generationSeconds ?? generationSeconds),
      files: image.files,
      injection,
      lastError: undefined,
      warnings,
      retries: 0,
    });
    const first = this.#firstSeen.get(key)!;
    if (!first.reported) {
      first.reported = true;
      const created = Date.parse(vmi.metadata.creationTimestamp ?? '');
      const from = Number.isFinite(created) ? Math.max(created, first.at) : first.at;
      this.#o.metrics?.seedReadyLatency.observe(Math.max(0, this.#now() - from) / 1000);
    }
    if (changed) {
      const what = !this.#o.injector
        ? `seed image ${seed.datasource} ready at ${entry.path}`
        : attach
          ? `seed image ${seed.datasource} ready and attached to ${injection?.domain ?? 'the domain'}`
          : `seed image ${seed.datasource} staged for the incoming migration in launcher pod ${staged.join(', ')}`;
      this.#o.events.record(vmi, 'Normal', 'SeedReady', `${what} (sha256 ${sha.slice(0, 12)})`);
      for (const w of warnings) this.#o.events.record(vmi, 'Warning', 'SeedWarning', `${w.code}: ${w.message}`);
      this.#log.info(
        {
          namespace: target.namespace,
          name: target.name,
          datasource: seed.datasource,
          written,
          injected,
          seconds: generationSeconds,
        },
        'seed ready',
      );
    }
    this.#o.metrics?.reconcileTotal.inc({ result: 'success' });
    return 'success';
  }

  // ConfigDrive `devices` for tagged devices the spec does not pin: KubeVirt
  // reads their guest addresses from the domain, so the seed waits for it
  // (the seed gate holds such a VM paused meanwhile). Read before the first
  // image and kept: a seed re-rendered with other addresses would change
  // under a running guest. VMIs without such devices (or without libvirt)
  // never read the domain here.
  async #domainFacts(key: string, uid: string, vmi: VmiObject): Promise<DomainFacts | undefined> {
    const injector = this.#o.injector;
    const fields = devicesNeedingDomain(vmi);
    if (!injector?.domainDevices || fields.length === 0) return undefined;
    const read = this.#domainFactsRead.get(key);
    if (read?.uid === uid) return read.facts;
    const target = injectionTarget(key, uid, 'configdrive', vmi, this.#o.nodeName);
    // Per-pod (KubeVirt): any of this node's launcher pods whose libvirt has
    // the domain (a migration's target holds the same devices).
    const targets = injector.perPod
      ? (target.launcherPods ?? []).map((pod) => ({ ...target, launcherPods: [pod] }))
      : [target];
    let last: unknown;
    for (const t of targets) {
      try {
        const facts = await injector.domainDevices(t);
        this.#domainFactsRead.set(key, { uid, facts });
        return facts;
      } catch (e) {
        if (!(e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND')) throw e;
        last = e;
      }
    }
    throw new VmseedError(
      'DOMAIN_NOT_FOUND',
      `waiting for the domain to read tagged devices' addresses (${fields.join(', ')} set a tag without a pinned pciAddress; ` +
        'KubeVirt lists them in meta_data.json "devices" from the running domain); the seed is written once the domain is defined; will retry',
      { kind: 'retryable', field: fields[0], ...(last ? { cause: last } : {}) },
    );
  }

  async #plan(target: InjectionTarget, vmi: VmiObject, entry: Known): Promise<LauncherPlan> {
    const injector = this.#o.injector!;
    const probe = injector.activeDomainPods ? (pods: string[]) => injector.activeDomainPods!(target, pods) : undefined;
    return planLaunchers(
      target,
      target.launcherPods ?? [],
      migrationStateOf(vmi.status),
      this.#o.nodeName,
      { ...(entry.attachedPod ? { attachedPod: entry.attachedPod } : {}), stagedPods: entry.stagedPods ?? [] },
      probe,
    );
  }

  // Stages and releases what the plan says; returns the pods staged into.
  async #applyPlan(target: InjectionTarget, entry: Known, plan: LauncherPlan): Promise<string[]> {
    const injector = this.#o.injector!;
    const remember = () => {
      entry.launcherPods = [
        ...new Set([...(entry.attachedPod ? [entry.attachedPod] : []), ...(entry.stagedPods ?? [])]),
      ].sort();
    };
    for (const pod of plan.releaseFrom) {
      await injector.unstage?.({ ...target, launcherPods: [pod] });
      if (entry.attachedPod === pod) delete entry.attachedPod;
      entry.stagedPods = (entry.stagedPods ?? []).filter((p) => p !== pod);
      remember();
    }
    for (const pod of plan.stageIn) {
      await injector.stage?.({ ...target, launcherPods: [pod] }, entry.path);
      if (!(entry.stagedPods ?? []).includes(pod)) entry.stagedPods = [...(entry.stagedPods ?? []), pod];
      remember();
    }
    if (plan.attachTo !== undefined && entry.attachedPod !== plan.attachTo) {
      // A new launcher pod (the VM restarted, or a migration to it ended)
      // holds a new domain; a migrated one has our disk already (inject
      // finds it and does nothing).
      entry.attachedPod = plan.attachTo;
      entry.stagedPods = (entry.stagedPods ?? []).filter((p) => p !== plan.attachTo);
      entry.injectedSha = undefined;
      remember();
    }
    return plan.stageIn;
  }

  async #mtimeIso(path: string): Promise<string | undefined> {
    const st = await this.#o.store.imageStat(path);
    return st ? new Date(st.mtimeMs).toISOString() : undefined;
  }

  // A seed served over HTTP only (KubeVirt IMDS annotations): no image, no
  // disk; any image an earlier render made for this VMI is removed.
  async #ensureHttpOnly(key: string, vmi: VmiObject, uid: string, seed: Seed): Promise<WorkResult> {
    await this.#cleanup(key);
    if (!this.#o.seeds) {
      const warning = this.#o.status.problem(
        'DATASOURCE_OFF',
        'the VMI asks for KubeVirt IMDS (imds.kubevirt.io/enabled) but the NoCloud HTTP datasource is off; start the agent with --datasource-listen',
      );
      this.#o.status.update(key, uid, {
        state: 'skipped',
        warnings: [warning],
        lastError: undefined,
        retries: 0,
        datasource: undefined,
        imagePath: undefined,
      });
      this.#o.metrics?.reconcileTotal.inc({ result: 'success' });
      return 'success';
    }
    const prev = this.#o.status.get(key);
    const fresh = prev?.state !== 'ready' && prev?.state !== 'warning';
    this.#o.seeds.put(key, vmi, seed);
    const warnings = seed.warnings.map((w) => this.#o.status.problem(w.code, w.message, { field: w.field }));
    // No image: nothing of an earlier image's record may linger.
    this.#o.status.update(key, uid, {
      state: warnings.length > 0 ? 'warning' : 'ready',
      datasource: seed.datasource,
      imagePath: undefined,
      imageBytes: undefined,
      contentHash: undefined,
      generatedAt: undefined,
      generationSeconds: undefined,
      files: undefined,
      injection: undefined,
      lastError: undefined,
      warnings,
      retries: 0,
    });
    if (fresh)
      this.#o.events.record(vmi, 'Normal', 'SeedReady', 'seed served over HTTP only (KubeVirt IMDS annotations)');
    this.#o.metrics?.reconcileTotal.inc({ result: 'success' });
    return 'success';
  }

  #failed(
    key: string,
    vmi: VmiObject | undefined,
    e: unknown,
    started: number,
    progress: { generated: boolean },
  ): WorkResult {
    let err = asVmseedError(e);
    const attempts = (this.#o.failures?.(key) ?? 0) + 1;
    if (err.code === 'INTERNAL' && err.kind === 'retryable' && attempts >= MAX_INTERNAL_ATTEMPTS) {
      err = new VmseedError(
        'INTERNAL',
        `internal error, ${attempts} attempts in a row; vmseed stops retrying until the VMI changes (see the agent log)`,
        {
          kind: 'terminal',
          cause: err.cause,
        },
      );
    }
    let parkMs: number | undefined;
    if (err.code === 'RENDER_TIMEOUT' && err.kind === 'retryable') {
      const version = vmi?.metadata.resourceVersion;
      const prev = this.#renderTimeouts.get(key);
      const count = prev && prev.version === version ? prev.count + 1 : 1;
      this.#renderTimeouts.set(key, { version, count });
      if (count >= MAX_RENDER_TIMEOUTS) {
        parkMs = Math.min(
          (this.#o.renderTimeoutParkMs ?? RENDER_TIMEOUT_PARK_MS) * 2 ** (count - MAX_RENDER_TIMEOUTS),
          MAX_RENDER_TIMEOUT_PARK_MS,
        );
        err = new VmseedError(
          err.code,
          `rendering ran past the render worker's deadline ${count} times for this version of the VMI; vmseed tries again in ${formatSeconds(parkMs / 1000)} or when the VMI changes: make its cloud-init user-data and network-data smaller or simpler, or give the agent more CPU`,
          { kind: 'terminal', cause: err.cause, ...(err.field ? { field: err.field } : {}) },
        );
      }
    }
    if (err.code === 'CANCELLED') {
      // The agent is stopping: nothing is wrong with the VMI, so no error
      // on its status and no Event; the next start reconciles it again.
      const [namespace, name] = splitKey(key);
      this.#log.info({ namespace, name, code: err.code }, err.message);
      return 'retry';
    }
    const kind = err.kind;
    this.#o.metrics?.reconcileTotal.inc({ result: kind === 'terminal' ? 'terminal' : 'error' });
    this.#o.metrics?.reconcileErrors.inc({ code: err.code });
    if (!progress.generated)
      this.#o.metrics?.seedGenerationDuration.observe(
        { datasource: datasourceHint(vmi), result: 'error' },
        (performance.now() - started) / 1000,
      );
    const [namespace, name] = splitKey(key);
    const fields = { namespace, name, code: err.code, kind, ...(err.field ? { field: err.field } : {}) };
    if (err.code === 'INTERNAL')
      this.#log.error(
        { ...fields, err: { message: String((err.cause as Error)?.message ?? '').slice(0, 200) } },
        err.message,
      );
    else this.#log.warn(fields, err.message);
    if (vmi) {
      const uid = vmi.metadata.uid ?? key;
      this.#o.status.update(key, uid, {
        state: 'error',
        lastError: this.#o.status.problem(err.code, err.message, { kind, ...(err.field ? { field: err.field } : {}) }),
        retries: (this.#o.failures?.(key) ?? 0) + (kind === 'retryable' ? 1 : 0),
      });
      this.#o.events.record(vmi, 'Warning', 'SeedFailed', `${err.code}: ${err.message}`);
    }
    if (kind !== 'terminal') return 'retry';
    return parkMs === undefined ? 'terminal' : { terminal: true, retryAfterMs: parkMs };
  }

  async #prune(target: InjectionTarget, entry: Known): Promise<void> {
    if (!entry.needsPrune) return;
    await this.#o.store.prune({ namespace: target.namespace, name: target.name, uid: entry.uid }, entry.path);
    entry.needsPrune = false;
  }

  async #cleanup(key: string): Promise<void> {
    // Served no longer from this moment: the VMI is gone (or replaced), even
    // if taking its disk and image out takes a while or fails and retries.
    this.#o.seeds?.drop(key);
    const known = this.#known.get(key);
    // An HTTP-only seed has no image to remove.
    if (!known) return;
    const [namespace, name] = splitKey(key);
    await this.#removeImage(
      key,
      {
        namespace,
        name,
        uid: known.uid,
        path: known.path,
        datasource: known.datasource ?? 'nocloud',
        sha16: known.sha256.slice(0, 16),
      },
      known.annotations,
      known.launcherPods,
    );
  }

  async #removeImage(
    key: string,
    img: StoredImage,
    annotations: Record<string, string>,
    launcherPods: string[],
  ): Promise<void> {
    if (this.#o.injector) {
      const target: InjectionTarget = {
        namespace: img.namespace,
        name: img.name,
        uid: img.uid,
        datasource: img.datasource,
        annotations,
        launcherPods,
      };
      const t0 = performance.now();
      try {
        const res = await this.#o.injector.eject(target);
        if (res.action === 'detached')
          this.#o.metrics?.injectionDuration.observe(
            { operation: 'detach', result: 'success' },
            (performance.now() - t0) / 1000,
          );
      } catch (e) {
        // The domain went away with its VMI: nothing left to detach.
        if (!(e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND')) {
          this.#o.metrics?.injectionDuration.observe(
            { operation: 'detach', result: 'error' },
            (performance.now() - t0) / 1000,
          );
          throw e;
        }
      }
    }
    try {
      await this.#o.store.remove({ namespace: img.namespace, name: img.name, uid: img.uid });
    } catch (e) {
      // A directory vmseed did not make (a symlink, a file): reported and
      // left alone. Nothing of ours is left to remove, so the VMI is
      // forgotten rather than retried.
      if (!(e instanceof VmseedError && e.code === 'STORE_UNSAFE_PATH')) throw e;
      this.#o.metrics?.reconcileErrors.inc({ code: e.code });
      this.#log.warn(
        { namespace: img.namespace, name: img.name, code: e.code, kind: e.kind, field: e.field },
        e.message,
      );
    }
    if (this.#known.get(key)?.uid === img.uid) {
      this.#known.delete(key);
      this.#o.seeds?.drop(key);
    }
    this.#log.info({ namespace: img.namespace, name: img.name }, 'seed image removed');
  }
}

function injectionTarget(
  key: string,
  uid: string,
  datasource: Datasource,
  vmi: VmiObject,
  nodeName: string,
): InjectionTarget {
  const [namespace, name] = splitKey(key);
  const conditions = Array.isArray(vmi.status?.conditions)
    ? (vmi.status.conditions as Array<{ type?: unknown; status?: unknown }>)
    : [];
  return {
    namespace,
    name,
    uid,
    datasource,
    annotations: vmi.metadata.annotations ?? {},
    launcherPods: launcherPodsOnNode(vmi.status?.activePods, nodeName),
    vmi: {
      ...(typeof vmi.status?.phase === 'string' ? { phase: vmi.status.phase } : {}),
      startPaused: vmi.spec.startStrategy === 'Paused',
      pausedCondition: conditions.some((c) => c?.type === 'Paused' && c?.status === 'True'),
    },
  };
}

function sameList(a: string[], b: string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function datasourceHint(vmi: VmiObject | undefined): string {
  const a = vmi?.metadata.annotations?.['vmseed.io/cloud-init'] ?? '';
  if (/datasource:\s*["']?configdrive/i.test(a)) return 'configdrive';
  if (vmi?.spec.volumes?.some((v) => v.cloudInitConfigDrive)) return 'configdrive';
  return vmi ? 'nocloud' : 'unknown';
}
