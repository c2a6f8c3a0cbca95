// Puts the seed image into a libvirt domain and takes it out again, through
// a LibvirtClient (libvirt's RPC protocol, or one virsh process per call).
// Level-based: every call looks at the domain as it is now (live and
// next-boot config, one read) and does only what is missing (one attach),
// so it can be repeated.
import type { DomainState } from '../api/objects.ts';
import { domainFactsFromXml, type DomainFacts } from './domain-devices.ts';
import { cancelledBy, VmseedError } from '../errors.ts';
import {
  buildSeedDiskXml,
  parseDomainXml,
  SEED_ALIAS,
  SEED_TARGETS,
  seedBusFor,
  type DomainDisk,
  type DomainXmlInfo,
  type SeedBus,
} from './disk-xml.ts';
import type {
  EjectionResult,
  InjectionResult,
  InjectionTarget,
  Injector,
  InjectorCallOptions,
  InjectOptions,
} from './injector-contract.ts';
import type { ProcessSpawner } from './virsh/runner.ts';
import { domainId, type LibvirtClient, type LibvirtEvent } from './libvirt-client.ts';
import { DomainLock, type DomainTurn } from './domain-lock.ts';
import { VirshLibvirtClient } from './virsh/virsh-client.ts';
import { identityPublisher, type ImagePublisher } from './publish.ts';
import { PreparedAttaches } from './prepared-attach.ts';
import { isPodUid } from './launcher-pod.ts';
import {
  encodeUriValue,
  parseTemplate,
  renderForTarget,
  renderTemplate,
  usesPodUID,
  type Template,
} from './template.ts';

export interface ResumeContext {
  domain: string;
  uri: string;
  target: InjectionTarget;
  client: LibvirtClient;
  // The reconcile's: the resume (a libvirt call, or KubeVirt's unpause)
  // ends when the VMI goes or the agent stops, as every other step does.
  signal?: AbortSignal;
  // The injection's turn on the domain: a libvirt resume runs in it.
  turn?: DomainTurn;
}

/**
 * The seed gate's hook (the agent's src/agent/domain/seed-gate.ts makes it):
 * called for a paused domain, once the seed is in place, when the call said
 * `resume`. In KubeVirt it calls the VMI's `unpause` subresource.
 * `false`: the hook decided this pause is not the seed gate's to end.
 */
export type ResumeHook = (ctx: ResumeContext) => Promise<void | false>;

/** The default ResumeHook: libvirt's own resume, in the injection's turn on the domain. */
export const libvirtResume: ResumeHook = async ({ domain, uri, client, signal, turn }) => {
  await client.resume(uri, domain, { ...(signal ? { signal } : {}), ...(turn ? { turn } : {}) });
};

export interface LibvirtInjectorOptions {
  // How libvirt is reached; default: one virsh process per call (the
  // virsh* and spawner options below configure that one only).
  client?: LibvirtClient;
  // One change at a time per domain: the same lock as the RPC client's
  // (RpcLibvirtClientOptions.lock), so a change takes the domain's turn once.
  lock?: DomainLock;
  virshPath?: string;
  // Placeholders: {namespace} {name} {uid} {datasource} {podUID} (the
  // VMI's launcher pod on this node, see launcher-pod.ts). The templates
  // come checked (parseTemplate in template.ts).
  domainTemplate?: Template<'domain'>;
  // e.g. `qemu+unix:///session?socket=/pods/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`;
  // placeholder values are percent-encoded.
  uriTemplate?: Template<'uri'>;
  // How the domain's QEMU sees the image; {path} is the published path as
  // the agent sees it and {basename} its file name,
  // e.g. `/var/run/kubevirt-ephemeral-disks/vmseed/{basename}`.
  imagePathTemplate?: Template<'image-path'>;
  // Puts the image where the domain can open it (default: identity).
  publisher?: ImagePublisher;
  // The wanted bus; scsi falls back to virtio on a domain without a
  // virtio-scsi controller 0.
  bus?: SeedBus;
  // Change the running domain only, never its persistent config (KubeVirt:
  // a CONFIG change is what its launcher's sync would fight over).
  liveOnly?: boolean;
  timeoutMs?: number;
  maxOutputBytes?: number;
  detachTimeoutMs?: number;
  // Clients without events: how often a detach is checked.
  pollIntervalMs?: number;
  resume?: ResumeHook;
  spawner?: ProcessSpawner;
  sleep?: (ms: number) => Promise<void>;
}

const DEFAULT_DOMAIN = parseTemplate('domain', '{namespace}_{name}');
const DEFAULT_URI = parseTemplate('uri', 'qemu:///system');
const DEFAULT_IMAGE_PATH = parseTemplate('image-path', '{path}');

type Flag = '--live' | '--config';

// Per libvirt call: the injector's deadline, the caller's signal and, for
// a change, the domain's turn it runs in.
interface Call {
  timeoutMs: number;
  signal?: AbortSignal;
  turn?: DomainTurn;
}

const deviceFlags = (flags: Flag[], call: Call) => ({
  live: flags.includes('--live'),
  config: flags.includes('--config'),
  ...call,
});

const WHAT = "the VMI's libvirt work";

// A step that is not a libvirt call (a copy, a wait) does not start once
// the caller's signal has aborted.
function checkSignal(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw cancelledBy(signal, WHAT);
}

interface DomainView {
  state: DomainState;
  rawState: string;
  persistent: boolean;
  live: DomainDisk[] | undefined; // undefined: not running
  config: DomainDisk[] | undefined; // undefined: transient (or not looked at)
  scsiControllers: DomainXmlInfo['scsiControllers'];
}

/**
 * The Injector over a LibvirtClient (virsh by default), one change at a
 * time per domain. The constructor throws VmseedError CONFIG_INVALID for a
 * bus other than virtio or scsi.
 */
export class LibvirtInjector implements Injector {
  readonly #client: LibvirtClient;
  readonly #domainTemplate: Template<'domain'>;
  readonly #uriTemplate: Template<'uri'>;
  readonly #imagePathTemplate: Template<'image-path'>;
  readonly #bus: SeedBus;
  readonly #liveOnly: boolean;
  readonly #timeoutMs: number;
  readonly #detachTimeoutMs: number;
  readonly #pollIntervalMs: number;
  readonly #resume: ResumeHook;
  readonly #publisher: ImagePublisher;
  readonly #sleep: (ms: number) => Promise<void>;
  // One change at a time per domain; different domains run concurrently.
  readonly #lock: DomainLock;
  // Live-only (KubeVirt): the seed's attach, ready for a defined domain's start.
  readonly #prepared: PreparedAttaches | undefined;

  constructor(options: LibvirtInjectorOptions = {}) {
    this.#domainTemplate = options.domainTemplate ?? DEFAULT_DOMAIN;
    this.#uriTemplate = options.uriTemplate ?? DEFAULT_URI;
    this.#imagePathTemplate = options.imagePathTemplate ?? DEFAULT_IMAGE_PATH;
    this.#publisher = options.publisher ?? identityPublisher;
    this.#bus = options.bus ?? 'virtio';
    if (this.#bus !== 'virtio' && this.#bus !== 'scsi') {
      throw new VmseedError(
        'CONFIG_INVALID',
        `bus '${String(this.#bus)}' is not supported; use virtio or scsi (the only hot-pluggable ones)`,
        { field: 'bus' },
      );
    }
    this.#liveOnly = options.liveOnly ?? false;
    this.#lock = options.lock ?? new DomainLock();
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#client =
      options.client ??
      new VirshLibvirtClient({
        virshPath: options.virshPath ?? 'virsh',
        timeoutMs: this.#timeoutMs,
        maxOutputBytes: options.maxOutputBytes ?? 4 * 1024 * 1024,
        ...(options.spawner ? { spawner: options.spawner } : {}),
      });
    this.#detachTimeoutMs = options.detachTimeoutMs ?? 20_000;
    this.#pollIntervalMs = options.pollIntervalMs ?? 100;
    this.#resume = options.resume ?? libvirtResume;
    this.#sleep = options.sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms)));
    this.#prepared =
      this.#liveOnly && this.#client.supportsEvents
        ? new PreparedAttaches({
            client: this.#client,
            serialize: (id, fn) => this.#serialize(id, undefined, fn),
            timeoutMs: this.#timeoutMs,
          })
        : undefined;
  }

  // Attaches prepared for domains not started yet (tests, status).
  get preparedAttaches(): number {
    return this.#prepared?.size ?? 0;
  }

  attachingAtStart(uri: string, domain: string): Promise<void> | undefined {
    return this.#prepared?.sending(uri, domain);
  }

  /** The VMI under `key` ended: its prepared attaches go. */
  forget(key: string): void {
    this.#prepared?.forget(key);
  }

  /** Whether an attach is prepared (or sent, not yet reported) for the VMI under `key`. */
  holds(key: string): boolean {
    return this.#prepared?.holds(key) ?? false;
  }

  domainName(target: InjectionTarget): string {
    return renderForTarget(this.#domainTemplate, target);
  }

  uri(target: InjectionTarget): string {
    return renderForTarget(this.#uriTemplate, target, {}, encodeUriValue);
  }

  // `imagePath` is the published path (what the publisher returned).
  imagePathForDomain(target: InjectionTarget, imagePath: string): string {
    return renderForTarget(this.#imagePathTemplate, target, {
      path: imagePath,
      basename: imagePath.split('/').pop() ?? imagePath,
    });
  }

  get perPod(): boolean {
    return [this.#uriTemplate, this.#domainTemplate].some(usesPodUID) || this.#publisher.perPod === true;
  }

  get client(): LibvirtClient {
    return this.#client;
  }

  // Where a VMI's domain is (its launcher's libvirt on KubeVirt): what the
  // agent watches for the domain to appear. Throws like inject() does when
  // the launcher pod is unknown.
  locate(target: InjectionTarget): { uri: string; domain: string } {
    return { uri: this.uri(target), domain: this.domainName(target) };
  }

  #call(signal: AbortSignal | undefined, turn?: DomainTurn): Call {
    return { timeoutMs: this.#timeoutMs, ...(signal ? { signal } : {}), ...(turn ? { turn } : {}) };
  }

  // `after`: work on the domain's behalf that the caller does not wait for;
  // the next change to the domain still does. A call whose signal aborts
  // while it waits for its turn does not run.
  #serialize<T>(
    key: string,
    signal: AbortSignal | undefined,
    fn: (turn: DomainTurn) => Promise<T>,
    after?: (value: T) => Promise<unknown>,
  ): Promise<T> {
    return this.#lock.run(key, fn, { what: WHAT, ...(signal ? { signal } : {}), ...(after ? { after } : {}) });
  }

  // Resolves once every change in flight, and the work that follows one
  // (pruning older copies), is over; or after `timeoutMs`, false then.
  async idle(timeoutMs = Infinity): Promise<boolean> {
    const all = this.#lock.idle().then(() => true);
    if (timeoutMs === Infinity) return all;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<false>((r) => (timer = setTimeout(() => r(false), timeoutMs)));
    try {
      return await Promise.race([all, late]);
    } finally {
      clearTimeout(timer);
    }
  }

  async inject(target: InjectionTarget, imagePath: string, options: InjectOptions = {}): Promise<InjectionResult> {
    const domain = this.domainName(target);
    const uri = this.uri(target);
    const { signal } = options;
    let published = '';
    return this.#serialize(
      domainId(uri, domain),
      signal,
      async (turn) => {
        // The copy into the launcher's volume and the read of the domain do
        // not depend on each other. The read's requests go out first (they
        // are written once the microtasks queued here have run), so libvirt
        // works on them while the copy's synchronous file calls run. A
        // failed copy does not wait for the read (with the launcher not up
        // yet, its socket may not answer until the deadline); the read's
        // answer is then dropped. Without a copy there is nothing to overlap,
        // and the turn of the event loop would only add to the wait
        // (measured: docs/libvirt-rpc.md, "Tests and figures").
        const viewing = this.#view(uri, domain, signal);
        viewing.catch(() => {});
        if (!this.#publisher.passThrough) await new Promise((resolve) => setImmediate(resolve));
        checkSignal(signal);
        published = await this.#publisher.publish(target, imagePath);
        const source = this.imagePathForDomain(target, published);
        return this.#inject(target, domain, uri, source, await viewing, options, turn);
      },
      async () => {
        // Both views of the domain name `published` now: older copies (an
        // earlier seed's content-addressed name) are unused. Done after the
        // caller has its answer, still before the domain's next change; a
        // failure leaves a small stale file that unpublish() removes with
        // the rest.
        await this.#publisher.prune?.(target, published).catch(() => {});
      },
    );
  }

  // A migration target's launcher: the image at the path the migrated
  // domain will open, nothing attached (target.launcherPods: that one pod).
  async stage(target: InjectionTarget, imagePath: string, options: InjectorCallOptions = {}): Promise<string> {
    checkSignal(options.signal);
    const published = await this.#publisher.publish(target, imagePath);
    return this.imagePathForDomain(target, published);
  }

  // A launcher that no longer runs the VM (a migration's source): our copy
  // goes; its domain is not touched.
  async unstage(target: InjectionTarget, options: InjectorCallOptions = {}): Promise<void> {
    checkSignal(options.signal);
    await this.#publisher.unpublish(target);
  }

  // The pods (of `pods`) whose libvirt has the domain running or paused.
  async activeDomainPods(
    target: InjectionTarget,
    pods: string[],
    options: InjectorCallOptions = {},
  ): Promise<string[] | undefined> {
    if (!this.perPod) return undefined;
    const active: string[] = [];
    for (const pod of pods) {
      const t = { ...target, launcherPods: [pod] };
      try {
        const info = await this.#client.domainInfo(this.uri(t), this.domainName(t), this.#call(options.signal));
        if (info.state === 'running' || info.state === 'paused') active.push(pod);
      } catch (e) {
        checkSignal(options.signal);
        if (!(e instanceof VmseedError && (e.code === 'DOMAIN_NOT_FOUND' || e.code === 'LIBVIRT_UNREACHABLE')))
          return undefined;
      }
    }
    return active;
  }

  // Read only, so it takes no per-domain lock: an attach running at the same
  // time changes disks, never interfaces' or host devices' addresses.
  async domainDevices(target: InjectionTarget, options: InjectorCallOptions = {}): Promise<DomainFacts> {
    const domain = this.domainName(target);
    const facts = domainFactsFromXml(
      await this.#client.domainXml(this.uri(target), domain, this.#call(options.signal)),
    );
    if (!facts) {
      throw new VmseedError(
        'LIBVIRT_FAILED',
        `libvirt returned no <domain> XML for ${domain} (or more than 1 MiB); check the libvirt version; will retry`,
        { kind: 'retryable' },
      );
    }
    return facts;
  }

  async eject(target: InjectionTarget, options: InjectorCallOptions = {}): Promise<EjectionResult> {
    const { signal } = options;
    // A UID that is not a pod UID was never used (refused before any
    // write): nothing of ours is behind it.
    const pods = (target.launcherPods ?? []).filter(isPodUid);
    target = { ...target, launcherPods: pods };
    // No launcher pod on this node any more: its libvirt, its domain and
    // its volumes (with our published copy) went with it.
    if (this.perPod && pods.length === 0)
      return {
        action: 'none',
        domain: renderTemplate(this.#domainTemplate, {
          namespace: target.namespace,
          name: target.name,
          uid: target.uid,
          datasource: target.datasource,
        }),
      };
    if (!this.perPod || pods.length === 1) return this.#ejectOne(target, signal);
    // A migration left copies in several pods here: each one separately.
    let result: EjectionResult | undefined;
    for (const pod of pods) {
      const r = await this.#ejectOne({ ...target, launcherPods: [pod] }, signal);
      if (!result || r.action === 'detached') result = r;
    }
    return result!;
  }

  async #ejectOne(target: InjectionTarget, signal: AbortSignal | undefined): Promise<EjectionResult> {
    const domain = this.domainName(target);
    const uri = this.uri(target);
    this.#prepared?.drop(uri, domain);
    return this.#serialize(domainId(uri, domain), signal, async (turn) => {
      let result: EjectionResult;
      try {
        result = await this.#eject(domain, uri, signal, turn);
      } catch (e) {
        // A per-pod socket that no longer answers: the pod is gone.
        if (!(this.perPod && e instanceof VmseedError && e.code === 'LIBVIRT_UNREACHABLE')) throw e;
        result = { action: 'none', domain };
      }
      checkSignal(signal);
      await this.#publisher.unpublish(target);
      return result;
    });
  }

  // One read: state, persistence and both XML documents (the inactive one
  // only where it is used: never on KubeVirt, whose config is its own).
  async #view(uri: string, domain: string, signal: AbortSignal | undefined): Promise<DomainView> {
    const v = await this.#client.domainView(uri, domain, { ...this.#call(signal), inactive: !this.#liveOnly });
    const active = v.info.state === 'running' || v.info.state === 'paused';
    const liveXml = active ? parseDomainXml(v.liveXml) : undefined;
    const configXml =
      v.info.persistent && !this.#liveOnly && v.inactiveXml !== undefined ? parseDomainXml(v.inactiveXml) : undefined;
    // The RPC client addresses a domain by a handle it remembers (its UUID);
    // a domain renamed a moment ago is not the one we were asked for.
    const named = (liveXml ?? configXml)?.name;
    if (named !== undefined && named !== domain) {
      throw new VmseedError(
        'DOMAIN_NOT_FOUND',
        `libvirt answered for domain '${named}' when asked for '${domain}' (renamed just now?); will retry`,
        { kind: 'retryable' },
      );
    }
    return {
      state: v.info.state,
      rawState: v.info.rawState,
      persistent: v.info.persistent,
      live: liveXml?.disks,
      config: configXml?.disks,
      scsiControllers: (liveXml ?? configXml)?.scsiControllers ?? [],
    };
  }

  async #inject(
    target: InjectionTarget,
    domain: string,
    uri: string,
    source: string,
    view: DomainView,
    options: InjectOptions,
    turn: DomainTurn,
  ): Promise<InjectionResult> {
    if (this.#prepared && view.state === 'shutoff' && !view.live)
      await this.#prepare(this.#prepared, `${target.namespace}/${target.name}`, uri, domain, source, options.signal);
    const views = this.#changeableViews(domain, view);
    const bus = seedBusFor(this.#bus, view.scsiControllers);
    const targetDev = SEED_TARGETS[bus];
    checkTargetFree(domain, targetDev, views);
    const { stale, missing } = diskChanges(
      views,
      (d) => d.sourceFile === source && d.targetDev === targetDev && d.bus === bus,
    );
    const call = this.#call(options.signal, turn);
    let action: InjectionResult['action'] = 'none';
    let attachedAt: number | undefined;
    if (stale.length > 0) {
      // The seed changed: take the old disk out where it is, then attach.
      await this.#detach(uri, domain, stale, options.signal, turn);
      action = 'replaced';
    }
    let flags: string[] = missing;
    if (missing.length > 0) {
      if (action === 'none') action = 'attached';
      const xml = buildSeedDiskXml({ sourceFile: source, targetDev, bus, alias: SEED_ALIAS });
      await this.#client.attachDevice(uri, domain, xml, deviceFlags(missing, call));
      attachedAt = Date.now();
    } else if (action === 'none') {
      // Attached from the start event (prepared-attach.ts): this call
      // reports it, with libvirt's time of it.
      const sent = this.#prepared?.take(uri, domain, { source, targetDev, bus });
      if (sent) {
        action = 'attached';
        attachedAt = sent.at;
        flags = ['--live'];
      }
    }
    const resumed =
      view.state === 'paused' &&
      options.resume === true &&
      (await this.#resumeGate(domain, uri, target, options.signal, turn));
    return {
      action,
      domain,
      targetDev,
      bus,
      flags,
      domainState: view.state,
      persistent: view.persistent,
      seededAfterBoot: view.state === 'running' && action !== 'none',
      resumed,
      uri,
      ...(attachedAt !== undefined ? { attachedAt } : {}),
    };
  }

  // A defined domain that has not started (KubeVirt's launcher starts it a
  // moment after defining it): the attach it will need, made from its
  // defined XML (read only, never changed) and sent at its start event.
  // Anything that stops it (a read that fails, our target held by another
  // disk) is left to the reconcile after the start, which reports it.
  async #prepare(
    prepared: PreparedAttaches,
    key: string,
    uri: string,
    domain: string,
    source: string,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    let defined;
    try {
      defined = parseDomainXml(await this.#client.domainXml(uri, domain, { ...this.#call(signal), inactive: true }));
    } catch {
      checkSignal(signal);
      return;
    }
    if (defined.name !== domain) return;
    const bus = seedBusFor(this.#bus, defined.scsiControllers);
    const targetDev = SEED_TARGETS[bus];
    if (defined.disks.some((d) => d.targetDev === targetDev && !isOurs(d))) return;
    const xml = buildSeedDiskXml({ sourceFile: source, targetDev, bus, alias: SEED_ALIAS });
    prepared.prepare(uri, domain, { xml, source, targetDev, bus, key });
  }

  // The views of the domain a change goes to (live, next-boot config), or
  // why it cannot take one now.
  #changeableViews(domain: string, view: DomainView): DiskView[] {
    if (view.state === 'other') {
      throw new VmseedError(
        'DOMAIN_STATE_UNSUPPORTED',
        `domain '${domain}' is ${view.rawState}, neither running, paused nor shut off (e.g. shutting down or crashed); will retry`,
        { kind: 'retryable' },
      );
    }
    if (this.#liveOnly && !view.live) {
      throw new VmseedError(
        'DOMAIN_STATE_UNSUPPORTED',
        `domain '${domain}' is not running; the seed is attached to the running domain only (never to its persistent config, which KubeVirt owns); will retry`,
        { kind: 'retryable' },
      );
    }
    const views: DiskView[] = [];
    if (view.live) views.push({ flag: '--live', disks: view.live });
    if (view.config) views.push({ flag: '--config', disks: view.config });
    return views;
  }

  // The seed is in place on a paused domain the caller said to resume.
  async #resumeGate(
    domain: string,
    uri: string,
    target: InjectionTarget,
    signal: AbortSignal | undefined,
    turn: DomainTurn,
  ): Promise<boolean> {
    // Cancelled (the stop deadline, or the VMI went) the guest stays paused:
    // the next reconcile resumes it.
    if (signal?.aborted) throw cancelledBy(signal, "the seed gate's resume");
    const ctx = { domain, uri, target, client: this.#client, turn, ...(signal ? { signal } : {}) };
    return (await this.#resume(ctx)) !== false;
  }

  async #eject(
    domain: string,
    uri: string,
    signal: AbortSignal | undefined,
    turn: DomainTurn,
  ): Promise<EjectionResult> {
    let view: DomainView;
    try {
      view = await this.#view(uri, domain, signal);
    } catch (e) {
      // No domain, no disk: the VM went before its seed.
      if (e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND') return { action: 'none', domain };
      throw e;
    }
    const found: Array<{ flag: Flag; disk: DomainDisk }> = [];
    for (const [flag, disks] of [
      ['--live', view.live],
      ['--config', view.config],
    ] as const) {
      for (const d of disks ?? []) if (isOurs(d)) found.push({ flag, disk: d });
    }
    if (found.length === 0) return { action: 'none', domain };
    await this.#detach(uri, domain, found, signal, turn);
    return { action: 'detached', domain };
  }

  // detach-device per view (live and config may differ), then wait until
  // the live disk is really gone: libvirt reports success before the guest
  // has released it (virtio; a SCSI disk goes at once). With events, the
  // wait is libvirt's device-removed event; otherwise the live XML is polled.
  async #detach(
    uri: string,
    domain: string,
    where: Array<{ flag: Flag; disk: DomainDisk }>,
    signal: AbortSignal | undefined,
    turn: DomainTurn,
  ): Promise<void> {
    const aliases = new Set(where.filter((w) => w.flag === '--live').map((w) => w.disk.alias ?? SEED_ALIAS));
    // Listening before the detach: a SCSI disk's event can come before
    // libvirt's answer to it.
    const removal =
      aliases.size > 0 && this.#client.supportsEvents
        ? new RemovalWait(this.#client, uri, domain, aliases, signal)
        : undefined;
    try {
      for (const { flag, disk } of where) await this.#detachOne(uri, domain, flag, disk, signal, turn);
      if (aliases.size === 0) return;
      const gone = removal
        ? await this.#removed(uri, domain, aliases, removal, signal)
        : await this.#polledAway(uri, domain, aliases, signal);
      if (gone) return;
      throw new VmseedError(
        'DETACH_TIMEOUT',
        `seed disk still on domain '${domain}' ${this.#detachTimeoutMs} ms after detach-device; the guest did not release it (no ACPI hot-unplug support, or paused); will retry`,
        { kind: 'retryable' },
      );
    } finally {
      removal?.stop();
    }
  }

  async #detachOne(
    uri: string,
    domain: string,
    flag: Flag,
    disk: DomainDisk,
    signal: AbortSignal | undefined,
    turn: DomainTurn,
  ): Promise<void> {
    // Matched by libvirt on the target dev; the alias names our disk.
    const xml = buildSeedDiskXml({
      sourceFile: disk.sourceFile ?? '',
      targetDev: disk.targetDev,
      bus: disk.bus === 'scsi' ? 'scsi' : 'virtio',
      alias: disk.alias ?? SEED_ALIAS,
      address: null,
    });
    try {
      await this.#client.detachDevice(uri, domain, xml, deviceFlags([flag], this.#call(signal, turn)));
    } catch (e) {
      if (!(e instanceof VmseedError && e.code === 'DEVICE_NOT_FOUND')) throw e;
    }
  }

  // With events: a lost one (the connection dropped and came back) is
  // covered by reading the domain again whenever that happens, and once at
  // the end.
  async #removed(
    uri: string,
    domain: string,
    aliases: Set<string>,
    removal: RemovalWait,
    signal: AbortSignal | undefined,
  ): Promise<boolean> {
    const deadline = Date.now() + this.#detachTimeoutMs;
    while (!removal.done && Date.now() < deadline) {
      const woke = await removal.next(deadline - Date.now());
      checkSignal(signal);
      if (woke === 'reconnected' && !(await this.#stillAttached(uri, domain, aliases, signal))) return true;
    }
    return removal.done || !(await this.#stillAttached(uri, domain, aliases, signal));
  }

  // Without events: the live XML, read until the disk is gone.
  async #polledAway(
    uri: string,
    domain: string,
    aliases: Set<string>,
    signal: AbortSignal | undefined,
  ): Promise<boolean> {
    const deadline = Date.now() + this.#detachTimeoutMs;
    for (;;) {
      if (!(await this.#stillAttached(uri, domain, aliases, signal))) return true;
      if (Date.now() >= deadline) return false;
      await this.#sleep(this.#pollIntervalMs);
      checkSignal(signal);
    }
  }

  async #stillAttached(
    uri: string,
    domain: string,
    aliases: Set<string>,
    signal: AbortSignal | undefined,
  ): Promise<boolean> {
    let xml: string;
    try {
      xml = await this.#client.domainXml(uri, domain, this.#call(signal));
    } catch (e) {
      // The domain went, and the disk with it.
      if (e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND') return false;
      throw e;
    }
    return parseDomainXml(xml).disks.some((d) => d.alias !== undefined && aliases.has(d.alias));
  }
}

interface DiskView {
  flag: Flag;
  disks: DomainDisk[];
}

function isOurs(d: DomainDisk): boolean {
  return d.alias === SEED_ALIAS;
}

// Our fixed target held by a disk that is not ours: never take another name
// (it could be the one KubeVirt gives its next volume) and never touch that
// disk.
function checkTargetFree(domain: string, targetDev: string, views: DiskView[]): void {
  for (const v of views) {
    const holder = v.disks.find((d) => d.targetDev === targetDev && !isOurs(d));
    if (holder) {
      throw new VmseedError(
        'TARGET_IN_USE',
        `domain '${domain}' already has a disk on ${targetDev} (alias ${holder.alias ?? 'none'}) that is not vmseed's; vmseed attaches its seed only there and leaves that disk alone: free ${targetDev} or choose the other --disk-bus`,
        { kind: 'terminal', field: 'bus' },
      );
    }
  }
}

// Per view: our disks that are not the wanted one (to detach), and the
// views the wanted one is missing from (to attach to).
function diskChanges(
  views: DiskView[],
  wanted: (d: DomainDisk) => boolean,
): { stale: Array<{ flag: Flag; disk: DomainDisk }>; missing: Flag[] } {
  const stale: Array<{ flag: Flag; disk: DomainDisk }> = [];
  const missing: Flag[] = [];
  for (const v of views) {
    const ours = v.disks.filter(isOurs);
    for (const d of ours) if (!wanted(d)) stale.push({ flag: v.flag, disk: d });
    if (!ours.some(wanted)) missing.push(v.flag);
  }
  return { stale, missing };
}

// Waits for libvirt's device-removed events of `aliases` on one domain.
class RemovalWait {
  readonly #pending: Set<string>;
  readonly #off: () => void;
  #wake: ((why: 'removed' | 'reconnected' | 'timeout') => void) | undefined;
  #reconnected = false;

  readonly #signal: AbortSignal | undefined;
  readonly #onAbort = () => this.#wake?.('timeout');

  // `signal` aborted: the wait ends at once (as a timeout; the caller
  // checks the signal).
  constructor(client: LibvirtClient, uri: string, domain: string, aliases: Set<string>, signal?: AbortSignal) {
    this.#pending = new Set(aliases);
    this.#signal = signal;
    signal?.addEventListener('abort', this.#onAbort);
    this.#off = client.onEvent((e: LibvirtEvent) => {
      if (e.uri !== uri) return;
      if (e.type === 'device-removed' && e.domain === domain && this.#pending.delete(e.alias)) {
        if (this.#pending.size === 0) this.#wake?.('removed');
      } else if (
        (e.type === 'connection' && e.state === 'up') ||
        (e.type === 'lifecycle' && e.domain === domain && (e.event === 'undefined' || e.event === 'stopped'))
      ) {
        this.#reconnected = true;
        this.#wake?.('reconnected');
      }
    });
  }

  get done(): boolean {
    return this.#pending.size === 0;
  }

  next(ms: number): Promise<'removed' | 'reconnected' | 'timeout'> {
    if (this.done) return Promise.resolve('removed');
    if (this.#reconnected) {
      this.#reconnected = false;
      return Promise.resolve('reconnected');
    }
    if (this.#signal?.aborted) return Promise.resolve('timeout');
    return new Promise((resolve) => {
      const timer = setTimeout(() => finish('timeout'), Math.max(0, ms));
      const finish = (why: 'removed' | 'reconnected' | 'timeout') => {
        clearTimeout(timer);
        this.#wake = undefined;
        if (why === 'reconnected') this.#reconnected = false;
        resolve(why);
      };
      this.#wake = finish;
    });
  }

  stop(): void {
    this.#off();
    this.#signal?.removeEventListener('abort', this.#onAbort);
    this.#wake?.('timeout');
  }
}
