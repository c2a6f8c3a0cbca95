// LibvirtClient with one `virsh` process per call (the Virsh runner: no
// shell, process-group timeout, bounded output, classified errors). The
// fallback that works with any libvirt virsh can reach; no events.
import { VmseedError } from '../../errors.ts';
import {
  toDomainState,
  type CallOptions,
  type DeviceFlags,
  type DomainInfo,
  type DomainView,
  type LibvirtClient,
  type ViewOptions,
  type LibvirtEvent,
  type BlockStats,
} from '../libvirt-client.ts';
import { Virsh, XML_FILE, type ProcessSpawner } from './runner.ts';

export interface VirshLibvirtClientOptions {
  virshPath?: string;
  timeoutMs?: number;
  maxOutputBytes?: number;
  spawner?: ProcessSpawner;
}

// virsh's state words (LC_ALL=C) to libvirt's state names.
const VIRSH_STATES: Record<string, string> = {
  running: 'running',
  idle: 'blocked',
  paused: 'paused',
  'in shutdown': 'shutdown',
  'shut off': 'shutoff',
  crashed: 'crashed',
  pmsuspended: 'pmsuspended',
};

export function parseVirshDominfo(out: string): DomainInfo {
  const fields = new Map<string, string>();
  for (const line of out.split('\n')) {
    const i = line.indexOf(':');
    if (i > 0) fields.set(line.slice(0, i).trim(), line.slice(i + 1).trim());
  }
  const state = fields.get('State');
  const persistent = fields.get('Persistent');
  if (state === undefined || persistent === undefined) {
    throw new VmseedError(
      'VIRSH_FAILED',
      'virsh dominfo printed no State/Persistent lines; check the libvirt version',
      { kind: 'retryable' },
    );
  }
  const rawState = VIRSH_STATES[state] ?? 'unknown';
  return { state: toDomainState(rawState), rawState, persistent: persistent === 'yes' };
}

/**
 * The LibvirtClient with one `virsh` process per call (default 30 s each,
 * 4 MiB of output): the injector's default, and `--libvirt virsh`. No events.
 */
export class VirshLibvirtClient implements LibvirtClient {
  readonly kind = 'virsh';
  readonly supportsEvents: boolean = false;
  readonly #o: Required<Omit<VirshLibvirtClientOptions, 'spawner'>> & { spawner?: ProcessSpawner };

  constructor(o: VirshLibvirtClientOptions = {}) {
    this.#o = {
      virshPath: o.virshPath ?? 'virsh',
      timeoutMs: o.timeoutMs ?? 30_000,
      maxOutputBytes: o.maxOutputBytes ?? 4 * 1024 * 1024,
      spawner: o.spawner,
    };
  }

  #virsh(uri: string, o?: CallOptions): Virsh {
    return new Virsh({
      virshPath: this.#o.virshPath,
      uri,
      timeoutMs: o?.timeoutMs ?? this.#o.timeoutMs,
      maxOutputBytes: this.#o.maxOutputBytes,
      spawner: this.#o.spawner,
      ...(o?.signal ? { signal: o.signal } : {}),
    });
  }

  async version(uri: string, o?: CallOptions): Promise<string> {
    const out = await this.#virsh(uri, o).run(['version']);
    // The daemon's line is missing when virsh talks to its own build.
    const m = /Running against daemon:\s*([\d.]+)/.exec(out) ?? /Using library: libvirt\s+([\d.]+)/.exec(out);
    if (!m)
      throw new VmseedError('VIRSH_FAILED', 'virsh version printed no version; check the libvirt version', {
        kind: 'retryable',
      });
    return m[1];
  }

  // --domain/--file: a name starting with `-` stays a name.
  async domainInfo(uri: string, domain: string, o?: CallOptions): Promise<DomainInfo> {
    return parseVirshDominfo(await this.#virsh(uri, o).run(['dominfo', '--domain', domain]));
  }

  async domainXml(uri: string, domain: string, o?: CallOptions & { inactive?: boolean }): Promise<string> {
    return this.#virsh(uri, o).run(['dumpxml', ...(o?.inactive ? ['--inactive'] : []), '--domain', domain]);
  }

  // Up to three processes, only the ones the state asks for (a shut-off
  // domain's live XML is its definition; a transient one has no inactive
  // XML). The domain may change between them, which the level-based
  // injector tolerates (it re-reads on the next pass).
  async domainView(uri: string, domain: string, o?: ViewOptions): Promise<DomainView> {
    const info = await this.domainInfo(uri, domain, o);
    const wantInactive = o?.inactive !== false && info.persistent;
    const [liveXml, inactiveXml] = await Promise.all([
      info.state !== 'shutoff' || !wantInactive ? this.domainXml(uri, domain, { ...o, inactive: false }) : undefined,
      wantInactive ? this.domainXml(uri, domain, { ...o, inactive: true }) : undefined,
    ]);
    return { info, liveXml: (liveXml ?? inactiveXml)!, ...(inactiveXml !== undefined ? { inactiveXml } : {}) };
  }

  async attachDevice(uri: string, domain: string, xml: string, o: DeviceFlags): Promise<void> {
    await this.#virsh(uri, o).run(['attach-device', '--domain', domain, '--file', XML_FILE, ...flags(o)], { xml });
  }

  async detachDevice(uri: string, domain: string, xml: string, o: DeviceFlags): Promise<void> {
    await this.#virsh(uri, o).run(['detach-device', '--domain', domain, '--file', XML_FILE, ...flags(o)], { xml });
  }

  async resume(uri: string, domain: string, o?: CallOptions): Promise<void> {
    await this.#virsh(uri, o).run(['resume', '--domain', domain]);
  }

  // --domain/--device: a name starting with `-` stays a name.
  async blockStats(uri: string, domain: string, target: string, o?: CallOptions): Promise<BlockStats> {
    return parseVirshBlockStats(await this.#virsh(uri, o).run(['domblkstat', '--domain', domain, '--device', target]));
  }

  onEvent(_listener: (e: LibvirtEvent) => void): () => void {
    return () => {};
  }

  watch(_uri: string): () => void {
    return () => {};
  }

  async close(): Promise<void> {}
}

function flags(o: DeviceFlags): string[] {
  if (!o.live && !o.config)
    throw new VmseedError('INTERNAL', 'device change with neither live nor config', { kind: 'terminal' });
  return [...(o.live ? ['--live'] : []), ...(o.config ? ['--config'] : [])];
}

// `domblkstat` prints `<target> <field> <count>` per line, the five classic
// fields and, with newer libvirt, more (flush_operations, *_total_times);
// a field the driver does not keep is left out, here -1 as over RPC.
export function parseVirshBlockStats(out: string): BlockStats {
  const fields = new Map<string, number>();
  for (const line of out.split('\n')) {
    const m = /^\S+\s+(rd_req|rd_bytes|wr_req|wr_bytes|errs)\s+(-?\d{1,16})\s*$/.exec(line.trim());
    if (m) fields.set(m[1], Number(m[2]));
  }
  if (!fields.has('rd_req'))
    throw new VmseedError('VIRSH_FAILED', 'virsh domblkstat printed no rd_req line; check the libvirt version', {
      kind: 'retryable',
    });
  const f = (k: string) => fields.get(k) ?? -1;
  return { rdReq: f('rd_req'), rdBytes: f('rd_bytes'), wrReq: f('wr_req'), wrBytes: f('wr_bytes'), errs: f('errs') };
}
