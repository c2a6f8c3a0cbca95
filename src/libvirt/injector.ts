// Puts the seed image into a libvirt domain and takes it out again, through
// virsh. Level-based: every call looks at the domain as it is now (live and
// next-boot config) and does only what is missing, so it can be repeated.
import { VmseedError } from '../errors.ts';
import { buildSeedDiskXml, findSeedDisk, parseDomainXml, pickFreeTarget, SEED_ALIAS, type DomainDisk, type SeedBus } from './disk-xml.ts';
import type { DomainState, EjectionResult, InjectionResult, InjectionTarget, Injector } from './types.ts';
import { Virsh, XML_FILE, type ProcessSpawner } from './virsh.ts';

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
  // Placeholders: {namespace} {name} {uid} {datasource}.
  domainTemplate?: string;
  // e.g. `qemu+unix:///system?socket=/var/run/kubevirt/{uid}/libvirt-sock`.
  uriTemplate?: string;
  // How the domain's QEMU sees the image; {path} is the agent's path,
  // e.g. `/var/run/kubevirt-private/vmseed/{namespace}/{name}/{basename}`.
  imagePathTemplate?: string;
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

const PLACEHOLDERS = ['namespace', 'name', 'uid', 'datasource', 'path', 'basename'] as const;
type Vars = Partial<Record<(typeof PLACEHOLDERS)[number], string>>;

function checkTemplate(field: string, template: string, allowed: readonly string[]): void {
  for (const m of template.matchAll(/\{([^}]*)\}/g)) {
    if (!allowed.includes(m[1])) {
      throw new VmseedError('CONFIG_INVALID', `${field} '${template}' uses unknown placeholder {${m[1]}}; allowed: ${allowed.map((a) => `{${a}}`).join(' ')}`, { field });
    }
  }
}

export function renderTemplate(template: string, vars: Vars): string {
  return template.replace(/\{([a-z]+)\}/g, (whole, key: string) => (vars as Record<string, string | undefined>)[key] ?? whole);
}

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
  readonly #spawner: ProcessSpawner | undefined;
  readonly #sleep: (ms: number) => Promise<void>;
  // One change at a time per domain; different domains run concurrently.
  readonly #locks = new Map<string, Promise<unknown>>();

  constructor(options: VirshInjectorOptions = {}) {
    this.#virshPath = options.virshPath ?? 'virsh';
    this.#domainTemplate = options.domainTemplate ?? '{namespace}_{name}';
    this.#uriTemplate = options.uriTemplate ?? 'qemu:///system';
    this.#imagePathTemplate = options.imagePathTemplate ?? '{path}';
    checkTemplate('domainTemplate', this.#domainTemplate, ['namespace', 'name', 'uid', 'datasource']);
    checkTemplate('uriTemplate', this.#uriTemplate, ['namespace', 'name', 'uid', 'datasource']);
    checkTemplate('imagePathTemplate', this.#imagePathTemplate, PLACEHOLDERS);
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
    return renderTemplate(this.#domainTemplate, this.#vars(target));
  }

  uri(target: InjectionTarget): string {
    return renderTemplate(this.#uriTemplate, this.#vars(target));
  }

  imagePathForDomain(target: InjectionTarget, imagePath: string): string {
    return renderTemplate(this.#imagePathTemplate, { ...this.#vars(target), path: imagePath, basename: imagePath.split('/').pop() ?? imagePath });
  }

  #vars(t: InjectionTarget): Vars {
    return { namespace: t.namespace, name: t.name, uid: t.uid, datasource: t.datasource };
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

  inject(target: InjectionTarget, imagePath: string): Promise<InjectionResult> {
    const domain = this.domainName(target);
    const uri = this.uri(target);
    return this.#serialize(`${uri}\0${domain}`, () => this.#inject(target, domain, uri, this.imagePathForDomain(target, imagePath)));
  }

  eject(target: InjectionTarget): Promise<EjectionResult> {
    const domain = this.domainName(target);
    const uri = this.uri(target);
    return this.#serialize(`${uri}\0${domain}`, () => this.#eject(domain, uri));
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
