// A test double of KubeVirt's virt-launcher disk sync, ported from
// kubevirt/kubevirt pkg/virt-launcher/virtwrap/manager.go (SyncVMI's paused
// rule, syncDisks, getDetachedDisks, getAttachedDisks, getUpdatedDisks,
// checkIfDiskReadyToUse), disksource/disk_source.go (IsHotplugDisk,
// IsHotplugOrEmpty) and converter/storage/disk.go (makeDeviceName,
// formatDeviceName, getPrefixFromBus, assignDiskToSCSIController).
//
// It runs against a real libvirt domain through a virsh port, with the same
// rules and the same LIVE|CONFIG flags as the launcher, so a test can show
// whether a disk someone else attached survives KubeVirt's syncs and whether
// KubeVirt's own hotplug still works next to it.
import { XMLBuilder, XMLParser } from 'fast-xml-parser';

// v1.HotplugDiskDir (staging/src/kubevirt.io/api/core/v1/schema.go).
export const HOTPLUG_DISK_DIR = '/var/run/kubevirt/hotplug-disks/';

export interface KvDisk {
  type: string; // file | block
  device: string; // disk | cdrom | lun
  bus: string; // '' when the target has none
  targetDev: string;
  sourceFile?: string;
  sourceDev?: string;
  alias?: string;
  readonly: boolean;
  serial?: string;
  driver?: Record<string, string>;
  address?: Record<string, string>;
  model?: string;
}

/** disksource.Resolve(d).BackendPath() without dataStore overlays: file wins over dev. */
export function backendPath(d: KvDisk | undefined): string {
  if (!d) return '';
  return d.sourceFile || d.sourceDev || '';
}

export function isHotplugDisk(d: KvDisk | undefined): boolean {
  return backendPath(d).startsWith(HOTPLUG_DISK_DIR);
}

function isHotplugOrEmpty(d: KvDisk | undefined): boolean {
  return isHotplugDisk(d) || backendPath(d) === '';
}

function busAllowed(bus: string): boolean {
  return bus === '' || bus === 'virtio' || bus === 'scsi';
}

/** getDetachedDisks(old = live, new = spec). Only the target dev is compared. */
export function getDetachedDisks(live: KvDisk[], spec: KvDisk[]): KvDisk[] {
  const inSpec = new Set(spec.map((d) => d.targetDev));
  return live.filter((d) => isHotplugDisk(d) && busAllowed(d.bus) && !inSpec.has(d.targetDev));
}

/** getAttachedDisks(old = live, new = spec). */
export function getAttachedDisks(live: KvDisk[], spec: KvDisk[]): KvDisk[] {
  const inLive = new Set(live.map((d) => d.targetDev));
  return spec.filter((d) => isHotplugDisk(d) && busAllowed(d.bus) && !inLive.has(d.targetDev));
}

/** getUpdatedDisks(old = live, new = spec): cdroms under the prefix (or empty) that change or leave the spec are ejected/changed. */
export function getUpdatedDisks(live: KvDisk[], spec: KvDisk[]): KvDisk[] {
  const specByTarget = new Map(spec.map((d) => [d.targetDev, d]));
  const res: KvDisk[] = [];
  for (const old of live) {
    const found = specByTarget.get(old.targetDev);
    if (old.device !== 'cdrom' || (found && found.device !== 'cdrom')) continue;
    if (!isHotplugOrEmpty(old) || (found && !isHotplugOrEmpty(found))) continue;
    // Not in the spec: the new disk is the old one with an empty source (an eject).
    const next: KvDisk | undefined = found;
    if ((old.sourceFile ?? '') === (next?.sourceFile ?? '') && (old.sourceDev ?? '') === (next?.sourceDev ?? ''))
      continue;
    const cpy = structuredClone(old);
    delete cpy.sourceFile;
    delete cpy.sourceDev;
    if (next?.sourceFile) cpy.sourceFile = next.sourceFile;
    else if (next?.sourceDev) cpy.sourceDev = next.sourceDev;
    cpy.type = cpy.sourceFile ? 'file' : 'block';
    cpy.driver = { ...(cpy.driver ?? {}), type: 'raw' };
    res.push(cpy);
  }
  return res;
}

// ---- KubeVirt's target naming (converter/storage/disk.go) ----

export type KvBus = 'virtio' | 'scsi' | 'sata' | 'usb';

export function prefixFromBus(bus: KvBus): 'vd' | 'sd' {
  return bus === 'virtio' ? 'vd' : 'sd';
}

/** formatDeviceName: a port of Linux sd.c's sd_format_disk_name (0 → a, 25 → z, 26 → aa). */
export function formatDeviceName(prefix: string, index: number): string {
  let name = '';
  let i = index;
  while (i >= 0) {
    name = String.fromCharCode(97 + (i % 26)) + name;
    i = Math.floor(i / 26) - 1;
  }
  return prefix + name;
}

/** The lowest free index of the bus's prefix among the VMI's disks (makeDeviceName for a new name). */
export function nextDeviceName(bus: KvBus, usedTargets: Iterable<string>): { name: string; index: number } {
  const prefix = prefixFromBus(bus);
  const used = new Set(usedTargets);
  for (let i = 0; i < 26 * 26 * 26; i++) {
    const name = formatDeviceName(prefix, i);
    if (!used.has(name)) return { name, index: i };
  }
  throw new Error(`no free ${prefix} device name`);
}

export interface VmiDisk {
  /** The VMI's disk/volume name (DNS-1123): alias ua-<name>. */
  name: string;
  kind: 'disk' | 'cdrom';
  bus: KvBus;
  /** Where the launcher's QEMU opens it. */
  source: string;
  readonly?: boolean;
}

/** What KubeVirt's converter makes of the VMI's disks, in order: targets by bus prefix, SCSI drive addresses unit = index. */
export function convertVmiDisks(disks: VmiDisk[]): KvDisk[] {
  const used: string[] = [];
  return disks.map((d) => {
    const { name, index } = nextDeviceName(d.bus, used);
    used.push(name);
    return kvDisk(d, name, index);
  });
}

function kvDisk(d: VmiDisk, targetDev: string, index: number): KvDisk {
  const disk: KvDisk = {
    type: 'file',
    device: d.kind,
    bus: d.bus,
    targetDev,
    sourceFile: d.source,
    alias: `ua-${d.name}`,
    readonly: d.kind === 'cdrom' ? true : (d.readonly ?? false),
    driver: {
      name: 'qemu',
      type: 'raw',
      cache: 'none',
      error_policy: 'stop',
      ...(d.kind === 'cdrom' ? {} : { discard: 'unmap' }),
    },
  };
  if (d.kind === 'disk' && d.bus === 'virtio') disk.model = 'virtio-non-transitional';
  // assignDiskToSCSIController: controller 0 (hard coded), bus 0, unit = index.
  if (d.kind === 'disk' && d.bus === 'scsi')
    disk.address = { type: 'drive', controller: '0', bus: '0', unit: String(index) };
  return disk;
}

/** A hotplugged filesystem volume as virt-handler and the converter make it: `<name>.img` in hotplug-disks. */
export function hotplugVolumeDisk(spec: KvDisk[], name: string, bus: 'virtio' | 'scsi' = 'scsi'): KvDisk {
  const { name: target, index } = nextDeviceName(
    bus,
    spec.map((d) => d.targetDev),
  );
  return kvDisk({ name, kind: 'disk', bus, source: `${HOTPLUG_DISK_DIR}${name}.img` }, target, index);
}

// ---- XML ----

const parser = new XMLParser({
  ignoreAttributes: false,
  attributeNamePrefix: '@_',
  isArray: (_name, jpath) => jpath === 'domain.devices.disk',
  parseAttributeValue: false,
  parseTagValue: false,
  trimValues: false,
});

type XNode = Record<string, unknown>;

function attrs(node: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  if (node === null || typeof node !== 'object') return out;
  for (const [k, v] of Object.entries(node as XNode))
    if (k.startsWith('@_') && typeof v === 'string') out[k.slice(2)] = v;
  return out;
}

export function parseDomainDisks(xml: string): KvDisk[] {
  const doc = parser.parse(xml) as XNode;
  const domain = doc.domain as XNode | undefined;
  if (!domain) throw new Error('no <domain> element');
  const disks = ((domain.devices as XNode | undefined)?.disk ?? []) as XNode[];
  return disks.map((d) => {
    const a = attrs(d);
    const target = attrs(d.target);
    const source = attrs(d.source);
    const disk: KvDisk = {
      type: a.type ?? 'file',
      device: a.device ?? 'disk',
      bus: target.bus ?? '',
      targetDev: target.dev ?? '',
      readonly: d.readonly !== undefined,
    };
    if (source.file) disk.sourceFile = source.file;
    if (source.dev) disk.sourceDev = source.dev;
    const alias = attrs(d.alias).name;
    if (alias) disk.alias = alias;
    if (typeof d.serial === 'string') disk.serial = d.serial;
    if (d.driver !== undefined) disk.driver = attrs(d.driver);
    if (d.address !== undefined) disk.address = attrs(d.address);
    if (a.model) disk.model = a.model;
    return disk;
  });
}

const builder = new XMLBuilder({
  ignoreAttributes: false,
  attributeNamePrefix: '@_',
  format: true,
  suppressEmptyNode: true,
});

function prefixed(o: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [`@_${k}`, v]));
}

export function diskXml(d: KvDisk): string {
  const disk: XNode = { '@_type': d.type, '@_device': d.device };
  if (d.model) disk['@_model'] = d.model;
  if (d.driver) disk.driver = prefixed(d.driver);
  if (d.sourceFile) disk.source = { '@_file': d.sourceFile };
  else if (d.sourceDev) disk.source = { '@_dev': d.sourceDev };
  disk.target = { '@_dev': d.targetDev, ...(d.bus ? { '@_bus': d.bus } : {}) };
  if (d.readonly) disk.readonly = '';
  if (d.serial) disk.serial = d.serial;
  if (d.alias) disk.alias = { '@_name': d.alias };
  if (d.address) disk.address = prefixed(d.address);
  return builder.build({ disk });
}

// ---- the sync loop ----

/** virsh against the launcher's daemon; throws with virsh's stderr on failure. */
export type VirshPort = (args: string[], stdin?: string) => Promise<string>;

export interface SyncResult {
  resumed: boolean;
  detached: string[];
  attached: string[];
  updated: string[];
  skippedNotReady: string[];
  /** The error SyncVMI would return (SyncFailed), or undefined. */
  error?: string;
}

export interface KubevirtSyncOptions {
  domain: string;
  virsh: VirshPort;
  /** The domain built from the VMI spec: its disks. */
  spec: KvDisk[];
  /** checkIfDiskReadyToUse(path as the launcher sees it). */
  diskReady: (launcherPath: string) => Promise<boolean>;
  /** The VMI was started with startStrategy: Paused (KubeVirt's own pause record). */
  startPaused?: boolean;
}

export class KubevirtSync {
  readonly domain: string;
  readonly spec: KvDisk[];
  readonly history: SyncResult[] = [];
  #virsh: VirshPort;
  #diskReady: (p: string) => Promise<boolean>;
  // l.paused: pauses KubeVirt ordered itself (start paused, or a user's pause).
  #pausedByKubevirt: boolean;
  // l.domainModifyLock: SyncVMI, PauseVMI and UnpauseVMI run one at a time,
  // so a pass never reads "paused" and then resumes after an unpause did.
  #modifyLock: Promise<unknown> = Promise.resolve();

  constructor(o: KubevirtSyncOptions) {
    this.domain = o.domain;
    this.spec = structuredClone(o.spec);
    this.#virsh = o.virsh;
    this.#diskReady = o.diskReady;
    this.#pausedByKubevirt = o.startPaused ?? false;
  }

  get pausedByKubevirt(): boolean {
    return this.#pausedByKubevirt;
  }

  /** Runs work under the launcher's domain-modify lock: what it reads of the domain and the pause record is one moment. */
  exclusive<T>(work: () => Promise<T>): Promise<T> {
    return this.#locked(work);
  }

  #locked<T>(work: () => Promise<T>): Promise<T> {
    const run = this.#modifyLock.then(work, work);
    this.#modifyLock = run.catch(() => {});
    return run;
  }

  /** The VMI's `unpause` subresource as virt-handler → launcher performs it (UnpauseVMI: resume only a paused domain). */
  unpause(): Promise<void> {
    return this.#locked(async () => {
      if ((await this.#virsh(['domstate', this.domain])).trim() === 'paused') {
        await this.#virsh(['resume', this.domain]);
        this.#pausedByKubevirt = false;
      }
    });
  }

  /** The VMI's `pause` subresource (virtctl pause) as the launcher performs it (PauseVMI): suspend a running domain, and record the pause as KubeVirt's own. */
  pause(): Promise<void> {
    return this.#locked(async () => {
      if ((await this.#virsh(['domstate', this.domain])).trim() === 'running') {
        await this.#virsh(['suspend', this.domain]);
        this.#pausedByKubevirt = true;
      }
    });
  }

  /** A KubeVirt hotplug: the volume joins the VMI spec; passes that start after this call attach it, a pass already running does not. */
  hotplug(name: string, bus: 'virtio' | 'scsi' = 'scsi'): KvDisk {
    const d = hotplugVolumeDisk(this.spec, name, bus);
    this.spec.push(d);
    return d;
  }

  /** One SyncVMI pass over a running domain: the pause rule, then syncDisks. */
  sync(): Promise<SyncResult> {
    return this.#locked(() => this.#sync());
  }

  async #sync(): Promise<SyncResult> {
    const r: SyncResult = { resumed: false, detached: [], attached: [], updated: [], skippedNotReady: [] };
    // SyncVMI converts the VMI it was handed before it touches the domain; a
    // hotplug is a new VMI, synced by the next call. Snapshotted together with
    // the history entry, so an entry recorded before hotplug() can never hold
    // that volume's attach, and callers can mark history at the hotplug.
    const spec = structuredClone(this.spec);
    this.history.push(r);
    try {
      const state = (await this.#virsh(['domstate', this.domain])).trim();
      if (state === 'paused' && !this.#pausedByKubevirt) {
        await this.#virsh(['resume', this.domain]);
        r.resumed = true;
      }
      // util.GetDomainSpecWithFlags(dom, 0): the live definition.
      const live = parseDomainDisks(await this.#virsh(['dumpxml', this.domain]));
      for (const d of getDetachedDisks(live, spec)) {
        // manager.go marshals the disk and lower-cases the whole XML.
        await this.#virsh(['detach-device', this.domain, '/dev/stdin', '--live', '--config'], diskXml(d).toLowerCase());
        r.detached.push(d.targetDev);
      }
      for (const d of getAttachedDisks(live, spec)) {
        if (!(await this.#diskReady(backendPath(d)))) {
          r.skippedNotReady.push(d.targetDev);
          continue;
        }
        await this.#virsh(['attach-device', this.domain, '/dev/stdin', '--live', '--config'], diskXml(d).toLowerCase());
        r.attached.push(d.targetDev);
      }
      for (const d of getUpdatedDisks(live, spec)) {
        const p = backendPath(d);
        if (p !== '' && !(await this.#diskReady(p))) continue;
        await this.#virsh(['update-device', this.domain, '/dev/stdin', '--live', '--config'], diskXml(d).toLowerCase());
        r.updated.push(d.targetDev);
      }
    } catch (e) {
      r.error = e instanceof Error ? e.message : String(e);
    }
    return r;
  }

  errors(): string[] {
    return this.history.flatMap((h) => (h.error ? [h.error] : []));
  }
}
