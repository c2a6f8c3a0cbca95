// Level-based reconcile of one VMI key: read the latest object from the
// cache and make the world match it. Ours and here: render, build, write
// (skipped when the content hash is unchanged), inject (skipped when this
// hash is already injected), then prune the VMI's older images. Image paths
// are content-addressed (see src/disk/store.ts): a new seed is a new path, so
// the injector, comparing the domain's source path with ours, replaces the
// disk, also after a restart that lost what was injected. Gone, moved,
// Succeeded or Failed: detach and remove. Running it twice does nothing the
// second time.
import type { Logger } from 'pino';
import { devicesNeedingDomain } from '../cloudinit/devices-metadata.ts';
import type { DomainFacts } from '../libvirt/domain-devices.ts';
import { withHostNuma, type HostNumaReader } from '../libvirt/host-numa.ts';
import type { RefResolver, VmiObject, Datasource } from '../api/objects.ts';
import type { Seed } from '../cloudinit/seed.ts';
import type { SchemaWarningInfo } from '../status/snapshot.ts';
import { seedTimestamp } from '../cloudinit/timestamp.ts';
import { releaseImageBytes } from '../disk/seed-image.ts';
import { asVmseedError, VmseedError, type ErrorCode } from '../errors.ts';
import type { InjectionResult, InjectionTarget, InjectOptions, Injector } from '../libvirt/injector-contract.ts';
import {
  launcherPodOf,
  launcherPodsOnNode,
  migrationInProgress,
  migrationStateOf,
  planLaunchers,
  type LauncherPlan,
} from '../libvirt/launcher-pod.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { RenderOutcome } from '../cloudinit/render.ts';
import type { VmiStatusRecord } from '../status/snapshot.ts';
import type {
  AgentRenderOptions,
  BuildSeedImage,
  BuiltImage,
  RenderSeed,
  SeedImageStore,
  StoredImage,
} from './deps.ts';
import type { EventRecorder } from './events.ts';
import { newProgress, ReconcileRecorder, type Outcome, type Progress, type StepFacts } from './reconcile-recorder.ts';
import type { ReportPlan, ReportPlanner } from './provisioning/report-plan.ts';
import { ReconcileSignals } from './reconcile-signals.ts';
import { missingSeedGate, resumeAfterSeed, seedGateFacts } from './domain/seed-gate.ts';
import { throwIfCancelled, type ShutdownDeadline } from './shutdown.ts';
import type { StatusStore } from './status-store.ts';
import type { ImageFacts, VmiRecords } from './vmi-records.ts';
import { splitKey, type Problem } from './vmi-status.ts';
import type { WorkResult } from './work-queue.ts';
import type { Attach, FirstBootFacts, SeedReadWatch } from './domain/seed-read.ts';

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
  // Where the facts about each VMI are kept between reconciles (the records
  // the status store shows).
  records: VmiRecords;
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
  // Libvirt's start events and the guest's first read of our disk.
  seedReads?: SeedReadWatch;
  // The stop deadline: each reconcile's steps get a signal that follows it.
  shutdown?: ShutdownDeadline;
  // KubeVirt without the admission webhook: a vmseed VMI that starts
  // unpaused gets SEED_GATE_MISSING (seed-gate.ts).
  warnMissingGate?: boolean;
  // Whether and where each seed asks cloud-init to report its progress
  // (progress-report.ts); absent: never.
  reportPlan?: ReportPlanner;
  // The seed gate of a VMI served over HTTP only (KubeVirt IMDS's
  // annotations): called once its seed is served; true when it unpaused.
  openServedGate?: (target: InjectionTarget, signal: AbortSignal) => Promise<boolean>;
}

// One reconcile as its steps see it: when it began, the signal that ends
// it (reconcile-signals.ts), and what it did so far.
interface Run {
  started: number;
  signal: AbortSignal;
  progress: Progress;
}

// Garbage collection at start-up, before any reconcile: only the stop ends it.
const NEVER = new AbortController().signal;

type Injection = NonNullable<VmiStatusRecord['injection']>;

// Where the image went: attached to the domain (injection, and whether this
// reconcile changed the domain), or only staged in these launcher pods.
interface Placement {
  injection: Injection | undefined;
  injected: boolean;
  attached: boolean;
  staged: string[];
  // This reconcile attached our disk (not replaced it): where and when.
  attach?: Attach;
}

export function nodeOf(vmi: VmiObject): string | undefined {
  return vmi.status?.nodeName || vmi.metadata.labels?.['kubevirt.io/nodeName'] || undefined;
}

export class Reconciler {
  readonly #o: ReconcilerOptions;
  readonly #log: Logger;
  readonly #records: VmiRecords;
  readonly #recorder: ReconcileRecorder;
  readonly #signals: ReconcileSignals;

  constructor(options: ReconcilerOptions) {
    this.#o = options;
    this.#log = options.logger;
    this.#records = options.records;
    this.#signals = new ReconcileSignals(options.shutdown);
    this.#recorder = new ReconcileRecorder({
      ...options,
      injecting: options.injector !== undefined,
      now: () => this.#now(),
    });
  }

  #now(): number {
    return this.#o.now ? this.#o.now() : Date.now();
  }

  // The guest's first read of its seed disk, or the end of the wait for it,
  // recorded by the same handler as everything else about the VMI.
  seedRead(key: string, facts: FirstBootFacts): void {
    this.#recorder.seedRead(key, this.#o.cache.get(key), facts);
  }

  // An event for `key`: a reconcile of it in flight whose object was
  // deleted, replaced, moved away or superseded by a newer generation is
  // cancelled (the queue runs the key again after it).
  changed(key: string): void {
    const vmi = this.#o.cache.get(key);
    this.#signals.changed(key, vmi, vmi !== undefined && this.isHere(vmi));
  }

  // The guest asked the HTTP datasource before its seed was served.
  seededAfterBootOverHttp(key: string, uid: string, missedAt: Date, servedAt: Date): void {
    this.#recorder.seededAfterBootOverHttp(key, this.#o.cache.get(key), uid, missedAt, servedAt);
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
    const { steps } = newProgress();
    const signal = this.#o.shutdown?.reconciles ?? NEVER;
    for (const img of images) {
      const key = `${img.namespace}/${img.name}`;
      const live = this.#o.cache.get(key);
      if (live && live.metadata.uid === img.uid && this.isHere(live) && (await this.#adopt(key, img, live))) {
        kept++;
        continue;
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
          { steps, signal },
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
    this.#recorder.observeSteps(steps);
    this.#log.info({ kept, removed }, 'garbage collection of seed images done');
    return { kept, removed };
  }

  // An image of a VMI that is here, remembered with the hash of what is on
  // disk; false when it cannot be read (then it is removed).
  async #adopt(key: string, img: StoredImage, live: VmiObject): Promise<boolean> {
    const had = this.#records.get(key)?.image;
    const sha = await this.#o.store.hashImage(img.path);
    if (sha === undefined) return false;
    // Several images (a crash between write and prune): all stay, the
    // first reconcile decides. An image whose content matches its name
    // is preferred as the one on record.
    if (had) {
      had.needsPrune = true;
      if (!sha.startsWith(img.sha16)) return true;
    }
    this.#records.of(key).image = {
      uid: img.uid,
      datasource: img.datasource,
      path: img.path,
      sha256: sha,
      needsPrune: had !== undefined,
      annotations: live.metadata.annotations ?? {},
      launcherPods: launcherPodsOnNode(live.status?.activePods, this.#o.nodeName),
    };
    return true;
  }

  // The reconcile finds what is and makes it so (#sync); what it found, or
  // the error, is recorded by the handler around it.
  async reconcile(key: string): Promise<WorkResult> {
    const vmi = this.#o.cache.get(key);
    const run: Run = {
      started: performance.now(),
      signal: this.#signals.begin(key, vmi),
      progress: newProgress(),
    };
    let outcome: Outcome;
    try {
      outcome = await this.#sync(key, vmi, run);
    } catch (e) {
      return this.#recorder.failed(key, vmi, e, run.started, run.progress);
    } finally {
      this.#signals.end(key);
    }
    return this.#recorder.succeeded(key, vmi, outcome, run.progress);
  }

  async #sync(key: string, vmi: VmiObject | undefined, run: Run): Promise<Outcome> {
    if (!vmi || !this.isHere(vmi)) {
      const other = vmi && this.#o.reportOtherNodes ? nodeOf(vmi) : undefined;
      if (vmi && other !== undefined && other !== this.#o.nodeName) {
        await this.#cleanup(key, run);
        return this.#otherNode(vmi, other);
      }
      await this.#end(key, run);
      return { kind: 'gone' };
    }
    const uid = vmi.metadata.uid ?? key;
    const r = this.#records.of(key);
    delete r.otherNode;
    if (r.firstSeen?.uid !== uid) r.firstSeen = { uid, at: this.#now(), reported: false };
    if (r.image && r.image.uid !== uid) await this.#cleanup(key, run); // same name, new object
    const outcome = await this.#render(key, uid, vmi, run.signal);
    if (outcome.kind === 'skip') {
      await this.#cleanup(key, run);
      return { kind: 'skipped', warning: outcome.warning && problemOf(outcome.warning), event: true };
    }
    const seed = outcome.seed;
    if (seed.bootstrapSentinel) r.bootstrapSentinel = { uid, where: seed.bootstrapSentinel };
    else delete r.bootstrapSentinel;
    if (seed.delivery === 'http') return this.#serveOnly(key, vmi, seed, run);
    return this.#seed(key, uid, vmi, seed, run);
  }

  #otherNode(vmi: VmiObject, node: string): Outcome {
    const via = vmi.status?.nodeName ? 'status.nodeName' : 'label kubevirt.io/nodeName';
    const message =
      `the VMI names node "${node}" (${via}) and this agent is ` +
      `--node-name "${this.#o.nodeName}"; remove the label from the manifest or start the agent with --node-name ${node}`;
    const field = vmi.status?.nodeName ? 'status.nodeName' : 'metadata.labels.kubevirt.io/nodeName';
    return { kind: 'other-node', node, warning: { code: 'VMI_ON_OTHER_NODE', message, field } };
  }

  // Render, then again with the domain's facts when a ConfigDrive lists
  // tagged devices the spec does not pin.
  async #render(key: string, uid: string, vmi: VmiObject, signal: AbortSignal): Promise<RenderOutcome> {
    const options = { ...this.#o.renderOptions, signal };
    const plan = this.#o.reportPlan?.(vmi, uid);
    const reporting = plan && 'url' in plan ? { reportUrl: plan.url } : {};
    let outcome = await this.#o.render(vmi, this.#o.refs, options, reporting);
    if (outcome.kind === 'seed' && outcome.seed.datasource === 'configdrive') {
      const facts = await this.#domainFacts(key, uid, vmi, signal);
      if (facts) {
        const domainDevices = this.#o.hostNuma ? await withHostNuma(facts.devices, this.#o.hostNuma) : facts.devices;
        outcome = await this.#o.render(vmi, this.#o.refs, options, {
          domainDevices,
          vcpuPins: facts.vcpuPins,
          ...reporting,
        });
      }
    }
    if (plan && outcome.kind === 'seed') this.#showReporting(key, uid, plan, outcome.seed);
    return outcome;
  }

  // "progress not reported" and why, on the status page.
  #showReporting(key: string, uid: string, plan: ReportPlan, seed: Seed): void {
    const reason = 'reason' in plan ? plan.reason : seed.progressNotReported;
    if (this.#o.status.get(key)?.progressNotReported !== reason)
      this.#o.status.update(key, uid, { progressNotReported: reason });
  }

  // The seed as an image in place: image → placement (inject or stage) →
  // prune → report.
  async #seed(key: string, uid: string, vmi: VmiObject, seed: Seed, run: Run): Promise<Outcome> {
    const shown = this.#o.status.get(key);
    // Rendering and building are each one synchronous stretch: let the
    // event loop run between them.
    await new Promise<void>((resolve) => setImmediate(resolve));
    const image = this.#build(seed, vmi, run);
    const target = injectionTarget(key, uid, seed.datasource, vmi, this.#o.nodeName);
    const size = image.bytes.length;
    const { entry, written } = await this.#image(key, uid, target, seed.datasource, image, run);
    releaseImageBytes(image.bytes);
    this.#o.seeds?.put(key, vmi, seed);
    const seconds = (performance.now() - run.started) / 1000;
    if (written) run.progress.written = { datasource: seed.datasource, seconds };
    run.progress.generated = true;
    const placed = await this.#place(target, vmi, entry, image.sha256, shown?.injection, run);
    // The domain uses entry.path now (or there is no domain): older images
    // are no one's any more. A failed prune is retried by the next reconcile.
    await this.#prune(target, entry);
    return this.#report(
      seed,
      { path: entry.path, size, sha256: image.sha256, files: image.files },
      written,
      seconds,
      placed,
      shown,
      this.#o.warnMissingGate ? missingSeedGate(vmi) : undefined,
    );
  }

  // What the status and the Events say about the image in place.
  async #report(
    seed: Seed,
    image: { path: string; size: number; sha256: string; files: BuiltImage['files'] },
    written: boolean,
    seconds: number,
    placed: Placement,
    shown: VmiStatusRecord | undefined,
    gateMissing: Problem | undefined,
  ): Promise<Outcome> {
    const warnings = seed.warnings.map(problemOf);
    if (gateMissing) warnings.push(gateMissing);
    // Kept for as long as the VMI lives, not only on the reconcile that
    // attached: the guest booted without its seed, and that stays true.
    if (placed.injection?.seededAfterBoot)
      warnings.push({
        code: 'SEEDED_AFTER_BOOT',
        message: `the seed was attached to running domain ${placed.injection.domain}; the guest may have booted without it`,
      });
    const generatedAt = written
      ? new Date(this.#now()).toISOString()
      : (shown?.generatedAt ?? (await this.#mtimeIso(image.path)));
    return {
      kind: 'ready',
      status: {
        kind: 'ready',
        datasource: seed.datasource,
        imagePath: image.path,
        imageBytes: image.size,
        contentHash: image.sha256,
        generatedAt,
        generationSeconds: written ? seconds : (shown?.generationSeconds ?? seconds),
        files: image.files,
        injection: placed.injection,
        warnings,
      },
      written,
      injected: placed.injected,
      attached: placed.attached,
      staged: placed.staged,
      seconds,
      ...(placed.attach ? { attach: placed.attach } : {}),
    };
  }

  #build(seed: Seed, vmi: VmiObject, run: Run): BuiltImage {
    throwIfCancelled(run.signal, 'building the seed image');
    const t0 = performance.now();
    const image = this.#o.build(seed, seedTimestamp(vmi));
    run.progress.steps.builds.push({ datasource: seed.datasource, seconds: (performance.now() - t0) / 1000 });
    return image;
  }

  // The image on disk: written unless the one on record has this content
  // and is still there (level-based down to the file: an image deleted
  // behind our back is written again).
  async #image(
    key: string,
    uid: string,
    target: InjectionTarget,
    datasource: Datasource,
    image: BuiltImage,
    run: Run,
  ): Promise<{ entry: ImageFacts; written: boolean }> {
    const r = this.#records.of(key);
    const had = r.image;
    const sha = image.sha256;
    const size = image.bytes.length;
    const onDisk = had !== undefined && had.sha256 === sha && (await this.#o.store.imageStat(had.path))?.size === size;
    if (had && onDisk && had.datasource === datasource) return { entry: had, written: false };
    if (had && had.datasource !== undefined && had.datasource !== datasource) await this.#cleanup(key, run);
    throwIfCancelled(run.signal, 'writing the seed image');
    const res = await this.#o.store.write(
      { namespace: target.namespace, name: target.name, uid },
      datasource,
      image.bytes,
      {
        fsync: this.#o.fsync ?? true,
        sha256: sha,
        signal: run.signal,
      },
    );
    // Where the previous image went stays known (a new seed for the same
    // launcher pods).
    const placed =
      had?.uid === uid
        ? {
            launcherPods: had.launcherPods,
            ...(had.attachedPod ? { attachedPod: had.attachedPod } : {}),
            stagedPods: had.stagedPods ?? [],
          }
        : { launcherPods: target.launcherPods ?? [] };
    const entry: ImageFacts = {
      uid,
      datasource,
      path: res.path,
      sha256: sha,
      needsPrune: true,
      annotations: target.annotations,
      ...placed,
    };
    r.image = entry;
    run.progress.steps.images.push({ datasource, bytes: size });
    return { entry, written: res.written };
  }

  // The image where the VM is: attached to its domain, or (KubeVirt, during
  // a migration) staged in the launcher pods that will run it.
  async #place(
    target: InjectionTarget,
    vmi: VmiObject,
    entry: ImageFacts,
    sha: string,
    shownInjection: Injection | undefined,
    run: Run,
  ): Promise<Placement> {
    const injector = this.#o.injector;
    let attached = injector !== undefined;
    let staged: string[] = [];
    if (injector?.perPod) {
      // Which of this node's launcher pods gets the disk, which (migration
      // targets) the image only, and which no longer run the VM.
      const plan = await this.#plan(target, vmi, entry, run.signal);
      staged = await this.#applyPlan(target, entry, plan, run.signal);
      attached = plan.attachTo !== undefined;
      if (plan.attachTo !== undefined) target.launcherPods = [plan.attachTo];
      else if (!plan.receiving) launcherPodOf({ ...target, launcherPods: [] }); // LAUNCHER_POD_UNKNOWN, retried
    } else if (!sameList(entry.launcherPods, target.launcherPods ?? [])) {
      // A new launcher pod (the VM restarted or migrated) holds a new domain.
      entry.launcherPods = target.launcherPods ?? [];
      entry.injectedSha = undefined;
    }
    if (!injector || !attached || entry.injectedSha === sha)
      return { injection: shownInjection, injected: false, attached, staged };
    const result = await this.#inject(injector, target, entry.path, shownInjection !== undefined, run, {
      signal: run.signal,
      resume: resumeAfterSeed(vmi),
    });
    entry.injectedSha = sha;
    const injection: Injection = {
      domain: result.domain,
      targetDev: result.targetDev,
      bus: result.bus,
      flags: result.flags,
      domainState: result.domainState,
      // A replaced disk on a running guest is a seed update, read at its next
      // boot: the guest booted with our previous disk, unless that one came late.
      seededAfterBoot: result.action === 'replaced' ? shownInjection?.seededAfterBoot === true : result.seededAfterBoot,
      resumed: result.resumed,
      at: new Date(this.#now()).toISOString(),
    };
    const attach =
      result.action === 'attached' && result.uri !== undefined && result.attachedAt !== undefined
        ? { uri: result.uri, domain: result.domain, targetDev: result.targetDev, attachedAt: result.attachedAt }
        : undefined;
    return { injection, injected: result.action !== 'none', attached, staged, ...(attach ? { attach } : {}) };
  }

  // `replacing`: the domain had one of our images already.
  async #inject(
    injector: Injector,
    target: InjectionTarget,
    path: string,
    replacing: boolean,
    run: Run,
    options: InjectOptions,
  ): Promise<InjectionResult> {
    const t0 = performance.now();
    const seconds = () => (performance.now() - t0) / 1000;
    let result: InjectionResult;
    try {
      result = await injector.inject(target, path, options);
    } catch (e) {
      const operation = replacing ? 'replace' : 'attach';
      run.progress.steps.injections.push({ operation, result: 'error', seconds: seconds() });
      throw e;
    }
    if (result.action !== 'none') {
      const operation = result.action === 'attached' ? 'attach' : 'replace';
      run.progress.steps.injections.push({ operation, result: 'success', seconds: seconds() });
    }
    return result;
  }

  // ConfigDrive `devices` for tagged devices the spec does not pin: KubeVirt
  // reads their guest addresses from the domain, so the seed waits for it
  // (the seed gate holds such a VM paused meanwhile). Read before the first
  // image and kept: a seed re-rendered with other addresses would change
  // under a running guest. VMIs without such devices (or without libvirt)
  // never read the domain here.
  async #domainFacts(key: string, uid: string, vmi: VmiObject, signal: AbortSignal): Promise<DomainFacts | undefined> {
    const injector = this.#o.injector;
    const fields = devicesNeedingDomain(vmi);
    if (!injector?.domainDevices || fields.length === 0) return undefined;
    const r = this.#records.of(key);
    if (r.domainFacts?.uid === uid) return r.domainFacts.facts;
    const target = injectionTarget(key, uid, 'configdrive', vmi, this.#o.nodeName);
    // Per-pod (KubeVirt): any of this node's launcher pods whose libvirt has
    // the domain (a migration's target holds the same devices).
    const targets = injector.perPod
      ? (target.launcherPods ?? []).map((pod) => ({ ...target, launcherPods: [pod] }))
      : [target];
    let last: unknown;
    for (const t of targets) {
      try {
        const facts = await injector.domainDevices(t, { signal });
        r.domainFacts = { uid, facts };
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

  async #plan(target: InjectionTarget, vmi: VmiObject, entry: ImageFacts, signal: AbortSignal): Promise<LauncherPlan> {
    const injector = this.#o.injector!;
    const probe = injector.activeDomainPods
      ? (pods: string[]) => injector.activeDomainPods!(target, pods, { signal })
      : undefined;
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
  async #applyPlan(
    target: InjectionTarget,
    entry: ImageFacts,
    plan: LauncherPlan,
    signal: AbortSignal,
  ): Promise<string[]> {
    const injector = this.#o.injector!;
    const remember = () => {
      entry.launcherPods = [
        ...new Set([...(entry.attachedPod ? [entry.attachedPod] : []), ...(entry.stagedPods ?? [])]),
      ].sort();
    };
    for (const pod of plan.releaseFrom) {
      await injector.unstage?.({ ...target, launcherPods: [pod] }, { signal });
      if (entry.attachedPod === pod) delete entry.attachedPod;
      entry.stagedPods = (entry.stagedPods ?? []).filter((p) => p !== pod);
      remember();
    }
    for (const pod of plan.stageIn) {
      await injector.stage?.({ ...target, launcherPods: [pod] }, entry.path, { signal });
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
  async #serveOnly(key: string, vmi: VmiObject, seed: Seed, run: Run): Promise<Outcome> {
    await this.#cleanup(key, run);
    if (!this.#o.seeds) {
      const message =
        'the VMI asks for KubeVirt IMDS (imds.kubevirt.io/enabled) but the NoCloud HTTP datasource is off; start the agent with --datasource-listen';
      return { kind: 'skipped', warning: { code: 'DATASOURCE_OFF', message }, event: false };
    }
    this.#o.seeds.put(key, vmi, seed);
    // The gate, as for a disk: the guest runs once its seed is there to fetch.
    if (this.#o.openServedGate && resumeAfterSeed(vmi)) {
      const uid = vmi.metadata.uid ?? key;
      await this.#o.openServedGate(injectionTarget(key, uid, seed.datasource, vmi, this.#o.nodeName), run.signal);
    }
    return { kind: 'served', datasource: seed.datasource, warnings: seed.warnings.map(problemOf) };
  }

  async #prune(target: InjectionTarget, entry: ImageFacts): Promise<void> {
    if (!entry.needsPrune) return;
    await this.#o.store.prune({ namespace: target.namespace, name: target.name, uid: entry.uid }, entry.path);
    entry.needsPrune = false;
  }

  // The VMI is gone from this node (deleted, finished, moved away): its disk
  // and image go, then its record and every per-VMI table registered with
  // the records. A failed removal throws first, so the VMI stays known and
  // the retry finds what is left.
  async #end(key: string, run: Run): Promise<void> {
    await this.#cleanup(key, run);
    this.#records.end(key);
  }

  async #cleanup(key: string, run: { progress: Progress; signal: AbortSignal }): Promise<void> {
    // Served no longer from this moment: the VMI is gone (or replaced), even
    // if taking its disk and image out takes a while or fails and retries.
    this.#o.seeds?.drop(key);
    const known = this.#records.get(key)?.image;
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
      { steps: run.progress.steps, signal: run.signal },
    );
  }

  async #removeImage(
    key: string,
    img: StoredImage,
    annotations: Record<string, string>,
    launcherPods: string[],
    { steps, signal }: { steps: StepFacts; signal: AbortSignal },
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
      await this.#eject(this.#o.injector, target, steps, signal);
    }
    throwIfCancelled(signal, 'removing the seed image');
    try {
      await this.#o.store.remove({ namespace: img.namespace, name: img.name, uid: img.uid });
    } catch (e) {
      // A directory vmseed did not make (a symlink, a file): reported and
      // left alone. Nothing of ours is left to remove, so the VMI is
      // forgotten rather than retried.
      if (!(e instanceof VmseedError && e.code === 'STORE_UNSAFE_PATH')) throw e;
      steps.unsafePaths++;
      this.#log.warn(
        { namespace: img.namespace, name: img.name, code: e.code, kind: e.kind, field: e.field },
        e.message,
      );
    }
    const r = this.#records.get(key);
    if (r?.image?.uid === img.uid) {
      delete r.image;
      this.#o.seeds?.drop(key);
    }
    this.#log.info({ namespace: img.namespace, name: img.name }, 'seed image removed');
  }

  async #eject(injector: Injector, target: InjectionTarget, steps: StepFacts, signal: AbortSignal): Promise<void> {
    const t0 = performance.now();
    const seconds = () => (performance.now() - t0) / 1000;
    try {
      const res = await injector.eject(target, { signal });
      if (res.action === 'detached')
        steps.injections.push({ operation: 'detach', result: 'success', seconds: seconds() });
    } catch (e) {
      // The domain went away with its VMI: nothing left to detach.
      if (!(e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND')) {
        steps.injections.push({ operation: 'detach', result: 'error', seconds: seconds() });
        throw e;
      }
    }
  }
}

// A warning or error as the status shows it (field kept when the source had one).
function problemOf(w: { code: ErrorCode; message: string; field?: string; schema?: SchemaWarningInfo }): Problem {
  return { code: w.code, message: w.message, field: w.field, ...(w.schema ? { schema: w.schema } : {}) };
}

function injectionTarget(
  key: string,
  uid: string,
  datasource: Datasource,
  vmi: VmiObject,
  nodeName: string,
): InjectionTarget {
  const [namespace, name] = splitKey(key);
  return {
    namespace,
    name,
    uid,
    datasource,
    annotations: vmi.metadata.annotations ?? {},
    launcherPods: launcherPodsOnNode(vmi.status?.activePods, nodeName),
    vmi: seedGateFacts(vmi),
  };
}

function sameList(a: string[], b: string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}
