// Puts the seed image into a libvirt domain and takes it out again, through
// virsh. Level-based: every call looks at the domain as it is now (live and
// next-boot config) and does only what is missing, so it can be repeated.
import { VmseedError } from '../errors.ts';
import { buildSeedDiskXml, findSeedDisk, parseDomainXml, pickFreeTarget, SEED_ALIAS, type DomainDisk, type SeedBus } from './disk-xml.ts';
import type { DomainState, EjectionResult, InjectionResult, InjectionTarget, Injector } from './types.ts';
import { Virsh, XML_FILE, type ProcessSpawner } from './virsh.ts';
import { identityPublisher, type ImagePublisher } from './publish.ts';
import { checkTemplate, IMAGE_PLACEHOLDERS, renderForTarget, renderTemplate, TARGET_PLACEHOLDERS, usesPodUID } from './template.ts';

export const RESUME_ANNOTATION = 'vmseed.io/resume-after-seed';

export interface ResumeContext {
  domain: string;
  uri: string;
  target: InjectionTarget;
  virsh: Virsh;
}

// In KubeVirt the agent calls the VMI's `unpause` subresource instead.
export type ResumeHook = (ctx: ResumeContext) => Promise<void>;

export const virshResume: ResumeHook = async ({ domain, virsh }) => {
  await virsh.run(['resume', domain]);
};

export interface VirshInjectorOptions {
  virshPath?: string;
  // Placeholders: {namespace} {name} {uid} {datasource} {podUID} (the
  // VMI's launcher pod on this node, see launcher-pod.ts).
  domainTemplate?: string;
  // e.g. `qemu+unix:///session?socket=/pods/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`.
  uriTemplate?: string;
  // How the domain's QEMU sees the image; {path} is the published path as
  // the agent sees it and {basename} its file name,
  // e.g. `/var/run/kubevirt/hotplug-disks/{basename}`.
  imagePathTemplate?: string;
  // Puts the image where the domain can open it (default: identity).
  publisher?: ImagePublisher;
  bus?: SeedBus;
  alias?: string;
  timeoutMs?: number;
  maxOutputBytes?: number;
  detachTimeoutMs?: number;
  pollIntervalMs?: number;
  resume?: ResumeHook;
  spawner?: ProcessSpawner;
  sleep?: (ms: number) => Promise<void>;
}

export { renderTemplate };

interface DomainView {
  state: DomainState;
  persistent: boolean;
  live: DomainDisk[] | undefined; // undefined: not running
  config: DomainDisk[] | undefined; // undefined: transient
}

export class VirshInjector implements Injector {
  readonly #virshPath: string;
  readonly #domainTemplate: string;
  readonly #uriTemplate: string;
  readonly #imagePathTemplate: string;
  readonly #bus: SeedBus;
  readonly #alias: string;
  readonly #timeoutMs: number;
  readonly #maxOutputBytes: number;
  readonly #detachTimeoutMs: number;
  readonly #pollIntervalMs: number;
  readonly #resume: ResumeHook;
  readonly #publisher: ImagePublisher;
  readonly #spawner: ProcessSpawner | undefined;
  readonly #sleep: (ms: number) => Promise<void>;
  // One change at a time per domain; different domains run concurrently.
  readonly #locks = new Map<string, Promise<unknown>>();

  constructor(options: VirshInjectorOptions = {}) {
    this.#virshPath = options.virshPath ?? 'virsh';
    this.#domainTemplate = options.domainTemplate ?? '{namespace}_{name}';
    this.#uriTemplate = options.uriTemplate ?? 'qemu:///system';
    this.#imagePathTemplate = options.imagePathTemplate ?? '{path}';
    checkTemplate('domainTemplate', this.#domainTemplate, TARGET_PLACEHOLDERS);
    checkTemplate('uriTemplate', this.#uriTemplate, TARGET_PLACEHOLDERS);
    checkTemplate('imagePathTemplate', this.#imagePathTemplate, IMAGE_PLACEHOLDERS);
    this.#publisher = options.publisher ?? identityPublisher;
    this.#bus = options.bus ?? 'virtio';
    if (this.#bus !== 'virtio' && this.#bus !== 'scsi') {
      throw new VmseedError('CONFIG_INVALID', `bus '${String(this.#bus)}' is not supported; use virtio or scsi (the only hot-pluggable ones)`, { field: 'bus' });
    }
    this.#alias = options.alias ?? SEED_ALIAS;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#maxOutputBytes = options.maxOutputBytes ?? 4 * 1024 * 1024;
    this.#detachTimeoutMs = options.detachTimeoutMs ?? 20_000;
    this.#pollIntervalMs = options.pollIntervalMs ?? 100;
    this.#resume = options.resume ?? virshResume;
    this.#spawner = options.spawner;
    this.#sleep = options.sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms)));
  }

  domainName(target: InjectionTarget): string {
    return renderForTarget(this.#domainTemplate, target);
  }

  uri(target: InjectionTarget): string {
    return renderForTarget(this.#uriTemplate, target);
  }

  // `imagePath` is the published path (what the publisher returned).
  imagePathForDomain(target: InjectionTarget, imagePath: string): string {
    return renderForTarget(this.#imagePathTemplate, target, { path: imagePath, basename: imagePath.split('/').pop() ?? imagePath });
  }

  #virsh(uri: string): Virsh {
    return new Virsh({ virshPath: this.#virshPath, uri, timeoutMs: this.#timeoutMs, maxOutputBytes: this.#maxOutputBytes, spawner: this.#spawner });
  }

  async #serialize<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#locks.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.#locks.set(key, tail);
    try {
      return await next;
    } finally {
      if (this.#locks.get(key) === tail) this.#locks.delete(key);
    }
  }

  async inject(target: InjectionTarget, imagePath: string): Promise<InjectionResult> {
    const domain = this.domainName(target);
    const uri = this.uri(target);
    return this.#serialize(`${uri}\0${domain}`, async () => {
      const published = await this.#publisher.publish(target, imagePath);
      const result = await this.#inject(target, domain, uri, this.imagePathForDomain(target, published));
      // Both views of the domain name `published` now: older copies (an
      // earlier seed's content-addressed name) are unused. A failure leaves
      // a small stale file that unpublish() removes with the rest.
      await this.#publisher.prune?.(target, published).catch(() => {});
      return result;
    });
  }

  async eject(target: InjectionTarget): Promise<EjectionResult> {
    const perPod = [this.#uriTemplate, this.#domainTemplate].some(usesPodUID) || this.#publisher.perPod === true;
    // No launcher pod on this node any more: its libvirt, its domain and
    // its volumes (with our published copy) went with it.
    if (perPod && (target.launcherPods ?? []).length === 0) return { action: 'none', domain: renderTemplate(this.#domainTemplate, { namespace: target.namespace, name: target.name, uid: target.uid, datasource: target.datasource }) };
    const domain = this.domainName(target);
    const uri = this.uri(target);
    return this.#serialize(`${uri}\0${domain}`, async () => {
      let result: EjectionResult;
      try {
        result = await this.#eject(domain, uri);
      } catch (e) {
        // A per-pod socket that no longer answers: the pod is gone.
        if (!(perPod && e instanceof VmseedError && e.code === 'LIBVIRT_UNREACHABLE')) throw e;
        result = { action: 'none', domain };
      }
      await this.#publisher.unpublish(target);
      return result;
    });
  }

  async #view(virsh: Virsh, domain: string): Promise<DomainView> {
    const info = parseDominfo(await virsh.run(['dominfo', domain]));
    const live = info.state === 'running' || info.state === 'paused'
      ? parseDomainXml(await virsh.run(['dumpxml', domain])).disks
      : undefined;
    const config = info.persistent ? parseDomainXml(await virsh.run(['dumpxml', '--inactive', domain])).disks : undefined;
    return { ...info, live, config };
  }

  async #inject(target: InjectionTarget, domain: string, uri: string, source: string): Promise<InjectionResult> {
    const virsh = this.#virsh(uri);
    const view = await this.#view(virsh, domain);
    if (view.state === 'other') {
      throw new VmseedError('DOMAIN_STATE_UNSUPPORTED', `domain '${domain}' is neither running, paused nor shut off (e.g. shutting down or crashed); will retry`, { kind: 'retryable' });
    }
    const views: Array<{ flag: '--live' | '--config'; disks: DomainDisk[] }> = [];
    if (view.live) views.push({ flag: '--live', disks: view.live });
    if (view.config) views.push({ flag: '--config', disks: view.config });

    const ours = views.map((v) => ({ ...v, disk: findSeedDisk(v.disks, this.#alias) }));
    const stale = ours.filter((v) => v.disk && v.disk.sourceFile !== source);
    const missing = ours.filter((v) => !v.disk || v.disk.sourceFile !== source);
    const existingTarget = ours.find((v) => v.disk)?.disk?.targetDev;

    let action: InjectionResult['action'] = 'none';
    let flags: string[] = [];
    let targetDev = existingTarget ?? '';
    let bus: SeedBus = (ours.find((v) => v.disk)?.disk?.bus as SeedBus | undefined) ?? this.#bus;

    if (missing.length > 0) {
      if (stale.length > 0) {
        // The seed changed: take the old disk out where it is, then attach.
        await this.#detach(virsh, domain, stale.map((v) => ({ flag: v.flag, disk: v.disk! })));
        action = 'replaced';
      } else {
        action = 'attached';
      }
      // Keep a target we already hold in one view (so live and config agree);
      // otherwise the first target no disk uses in either view.
      const others = views.flatMap((v) => v.disks.filter((d) => d.alias !== this.#alias).map((d) => d.targetDev));
      if (!existingTarget || others.includes(existingTarget) || bus !== this.#bus) {
        bus = this.#bus;
        targetDev = pickFreeTarget(bus, others);
      }
      flags = missing.map((v) => v.flag);
      const xml = buildSeedDiskXml({ sourceFile: source, targetDev, bus, alias: this.#alias });
      await virsh.run(['attach-device', domain, XML_FILE, ...flags], { xml });
    }

    let resumed = false;
    if (view.state === 'paused' && target.annotations[RESUME_ANNOTATION] === 'true') {
      await this.#resume({ domain, uri, target, virsh });
      resumed = true;
    }
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
    };
  }

  async #eject(domain: string, uri: string): Promise<EjectionResult> {
    const virsh = this.#virsh(uri);
    let view: DomainView;
    try {
      view = await this.#view(virsh, domain);
    } catch (e) {
      // No domain, no disk: the VM went before its seed.
      if (e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND') return { action: 'none', domain };
      throw e;
    }
    const found: Array<{ flag: '--live' | '--config'; disk: DomainDisk }> = [];
    const liveDisk = view.live && findSeedDisk(view.live, this.#alias);
    const configDisk = view.config && findSeedDisk(view.config, this.#alias);
    if (liveDisk) found.push({ flag: '--live', disk: liveDisk });
    if (configDisk) found.push({ flag: '--config', disk: configDisk });
    if (found.length === 0) return { action: 'none', domain };
    await this.#detach(virsh, domain, found);
    return { action: 'detached', domain };
  }

  // detach-device per view (live and config may differ), then wait until
  // the live disk is really gone: libvirt reports success before the guest
  // has released it.
  async #detach(virsh: Virsh, domain: string, where: Array<{ flag: '--live' | '--config'; disk: DomainDisk }>): Promise<void> {
    for (const { flag, disk } of where) {
      const xml = buildSeedDiskXml({ sourceFile: disk.sourceFile ?? '', targetDev: disk.targetDev, bus: disk.bus === 'scsi' ? 'scsi' : 'virtio', alias: this.#alias });
      try {
        await virsh.run(['detach-device', domain, XML_FILE, flag], { xml });
      } catch (e) {
        if (!(e instanceof VmseedError && e.code === 'DEVICE_NOT_FOUND')) throw e;
      }
    }
    if (!where.some((w) => w.flag === '--live')) return;
    const deadline = Date.now() + this.#detachTimeoutMs;
    for (;;) {
      const disks = parseDomainXml(await virsh.run(['dumpxml', domain])).disks;
      if (!findSeedDisk(disks, this.#alias)) return;
      if (Date.now() >= deadline) {
        throw new VmseedError('DETACH_TIMEOUT', `seed disk still on domain '${domain}' ${this.#detachTimeoutMs} ms after detach-device; the guest did not release it (no ACPI hot-unplug support, or paused); will retry`, { kind: 'retryable' });
      }
      await this.#sleep(this.#pollIntervalMs);
    }
  }
}

// `virsh dominfo` (LC_ALL=C): `State:          paused`, `Persistent:     yes`.
export function parseDominfo(out: string): { state: DomainState; persistent: boolean } {
  const fields = new Map<string, string>();
  for (const line of out.split('\n')) {
    const i = line.indexOf(':');
    if (i > 0) fields.set(line.slice(0, i).trim(), line.slice(i + 1).trim());
  }
  const rawState = fields.get('State');
  const persistent = fields.get('Persistent');
  if (rawState === undefined || persistent === undefined) {
    throw new VmseedError('VIRSH_FAILED', 'virsh dominfo printed no State/Persistent lines; check the libvirt version', { kind: 'retryable' });
  }
  const state: DomainState =
    rawState === 'running' || rawState === 'idle' ? 'running'
      : rawState === 'paused' ? 'paused'
        : rawState === 'shut off' ? 'shutoff'
          : 'other';
  return { state, persistent: persistent === 'yes' };
}
