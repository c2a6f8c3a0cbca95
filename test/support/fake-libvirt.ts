// A fake libvirt behind the ProcessSpawner seam: it answers like virsh 9.0
// did here (dominfo layout, dumpxml shape, the real error messages recorded
// in test/libvirt/virsh.test.ts). Every call is recorded with the URI it used.
// The device XML it is given is read by its own parser (fake-device-xml.ts),
// never by vmseed's.
import { readFileSync } from 'node:fs';
import { XmlRefused, parseDiskDevice, type FakeDisk } from './fake-device-xml.ts';
import type { ProcessSpawner, SpawnOptions, SpawnResult } from '../../src/libvirt/virsh/runner.ts';
import { encodeUriValue } from '../../src/libvirt/template.ts';
import type { DeviceFlags, LibvirtEvent } from '../../src/libvirt/libvirt-client.ts';
import { VirshLibvirtClient } from '../../src/libvirt/virsh/virsh-client.ts';

export interface FakeDomain {
  state: 'running' | 'paused' | 'shut off' | 'in shutdown';
  persistent: boolean;
  live: FakeDisk[];
  config: FakeDisk[];
  // The guest answers ACPI unplug (live detach completes).
  unplugs: boolean;
  // A virtio-scsi controller index 0 (KubeVirt adds one unless hotplug is
  // disabled and no disk uses scsi).
  scsi?: boolean;
  // Other <devices> children as libvirt prints them (interfaces, hostdevs).
  devicesXml?: string;
  // Other <domain> children (e.g. <cputune>).
  domainXml?: string;
}

// The calls that change a domain; reads (dominfo, dumpxml) may run beside a
// publish or be dropped with it.
export function changeCalls(lv: FakeLibvirt): string[][] {
  return lv.calls.filter((c) => c[0] !== 'dominfo' && c[0] !== 'dumpxml');
}

// A socket held open for a virsh child, as the injector's seam hands it out.
export interface FakeHeldSocket {
  fd: number;
  path: string;
  close(): void;
}

export class FakeLibvirt implements ProcessSpawner {
  domains = new Map<string, FakeDomain>();
  // Per-launcher libvirt daemons: the domains of a URI that contains the key
  // (e.g. a pod UID); other URIs reach `domains`.
  daemons = new Map<string, Map<string, FakeDomain>>();
  calls: string[][] = [];
  uris: string[] = [];
  failNext: Map<string, string> = new Map();

  // Sockets held for a call: a descriptor number per path. A URI dialling
  // /proc/self/fd/3 is recorded (and routed) as the socket held for it.
  readonly #held = new Map<number, string>();
  #nextFd = 1000;

  holdSocket(socketPath: string): FakeHeldSocket {
    const fd = this.#nextFd++;
    this.#held.set(fd, socketPath);
    return { fd, path: `/proc/self/fd/${fd}`, close: () => this.#held.delete(fd) };
  }

  #dialled(uri: string, fds: readonly number[] | undefined): string {
    if (!uri.includes('socket=/proc/self/fd/3')) return uri;
    const path = fds?.[0] === undefined ? undefined : this.#held.get(fds[0]);
    if (path === undefined) throw new Error(`virsh given ${uri} without a held socket as descriptor 3`);
    return uri.replace('socket=/proc/self/fd/3', `socket=${encodeUriValue(path)}`);
  }

  async run(_file: string, rawArgv: readonly string[], o: SpawnOptions): Promise<SpawnResult> {
    const argv = [...rawArgv];
    argv[2] = this.#dialled(argv[2], o.fds);
    // -q -c URI; `--domain X` and `--file F` (how the virsh client names
    // them) are recorded as the positional X and F.
    const args = argv.slice(3).filter((a) => a !== '--domain' && a !== '--file');
    this.uris.push(argv[2]);
    this.calls.push([...args]);
    const ok = (stdout = ''): SpawnResult => ({
      exitCode: 0,
      signal: null,
      stdout,
      stderr: '',
      timedOut: false,
      outputTruncated: false,
    });
    const fail = (stderr: string): SpawnResult => ({
      exitCode: 1,
      signal: null,
      stdout: '',
      stderr,
      timedOut: false,
      outputTruncated: false,
    });
    const [cmd] = args;
    const forced = this.failNext.get(cmd);
    if (forced) {
      this.failNext.delete(cmd);
      return fail(forced);
    }
    const name = args.find((a, i) => i > 0 && !a.startsWith('--'))!;
    const daemon = [...this.daemons].find(([k]) => argv[2].includes(k))?.[1] ?? this.domains;
    const d = daemon.get(name);
    if (!d) return fail(`error: failed to get domain '${name}'\n`);
    const active = d.state !== 'shut off';
    switch (cmd) {
      case 'dominfo':
        return ok(
          `Id:             ${active ? 1 : '-'}\nName:           ${name}\nUUID:           347ba555-a2a7-4ec0-b250-4eedce37b6f1\nOS Type:        hvm\nState:          ${d.state}\nCPU(s):         1\nPersistent:     ${d.persistent ? 'yes' : 'no'}\nAutostart:      disable\n`,
        );
      case 'dumpxml': {
        const disks = args.includes('--inactive') ? d.config : active ? d.live : d.config;
        const controllers = d.scsi
          ? "\n    <controller type='scsi' index='0' model='virtio-scsi'>\n      <alias name='scsi0'/>\n    </controller>"
          : '';
        return ok(
          `<domain type='qemu' id='1'>\n  <name>${name}</name>\n${d.domainXml ? `${d.domainXml}\n` : ''}  <devices>\n${disks.map(diskXml).join('\n')}${controllers}${d.devicesXml ? `\n${d.devicesXml}` : ''}\n  </devices>\n</domain>\n`,
        );
      }
      case 'resume':
        d.state = 'running';
        return ok();
      case 'attach-device':
      case 'detach-device': {
        let disk: FakeDisk;
        try {
          disk = parseDiskDevice(readFileSync(args[2], 'utf8'));
        } catch (e) {
          if (!(e instanceof XmlRefused)) throw e;
          return fail(
            `error: Failed to ${cmd === 'attach-device' ? 'attach' : 'detach'} device from ${args[2]}\nerror: ${e.message}\n`,
          );
        }
        const live = args.includes('--live');
        const config = args.includes('--config');
        if (config && !d.persistent)
          return fail(
            `error: Failed to ${cmd === 'attach-device' ? 'attach' : 'detach'} device from ${args[2]}\nerror: Requested operation is not valid: transient domains do not have any persistent config\n`,
          );
        if (live && !active)
          return fail(
            `error: Failed to attach device from ${args[2]}\nerror: Requested operation is not valid: domain is not running\n`,
          );
        for (const [flag, list] of [
          [live, d.live],
          [config, d.config],
        ] as const) {
          if (!flag) continue;
          const i = list.findIndex((x) => x.targetDev === disk.targetDev);
          if (cmd === 'attach-device') {
            if (disk.alias && list.some((x) => x.alias === disk.alias))
              return fail(
                `error: Failed to attach device from ${args[2]}\nerror: unsupported configuration: non unique alias detected: ${disk.alias}\n`,
              );
            if (i >= 0)
              return fail(
                `error: Failed to attach device from ${args[2]}\nerror: XML error: target '${disk.targetDev}' duplicated for disk sources '${list[i].sourceFile}' and '${disk.sourceFile}'\n`,
              );
            list.push(disk);
          } else {
            if (i < 0)
              return fail(
                `error: Failed to detach device from ${args[2]}\nerror: device not found: disk ${disk.targetDev} not found\n`,
              );
            if (list === d.config || d.unplugs) list.splice(i, 1);
          }
        }
        return ok();
      }
      default:
        return fail(`error: unknown command: '${cmd}'\n`);
    }
  }
}

// Attribute values escaped as libvirt's virBufferEscapeString does.
const esc = (v: string | undefined): string =>
  String(v).replace(/[<>&'"]/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', "'": '&apos;', '"': '&quot;' })[c]!);

export function diskXml(d: FakeDisk): string {
  return `    <disk type='${esc(d.type)}' device='${esc(d.device)}'>\n      <driver name='qemu' type='raw'/>\n      <source file='${esc(d.sourceFile)}' index='1'/>\n      <backingStore/>\n      <target dev='${esc(d.targetDev)}' bus='${esc(d.bus)}'/>\n${d.readonly ? '      <readonly/>\n' : ''}${d.alias ? `      <alias name='${esc(d.alias)}'/>\n` : ''}    </disk>`;
}

// The fake behind a LibvirtClient face with events, as the RPC client has
// them: a live detach the guest completes is followed by libvirt's
// device-removed event for the disk's alias.
export class EventingFakeClient extends VirshLibvirtClient {
  override readonly supportsEvents: boolean = true;
  readonly #lv: FakeLibvirt;
  readonly #listeners = new Set<(e: LibvirtEvent) => void>();

  constructor(lv: FakeLibvirt) {
    super({ spawner: lv });
    this.#lv = lv;
  }

  emit(e: LibvirtEvent): void {
    for (const l of this.#listeners) l(e);
  }

  override onEvent(listener: (e: LibvirtEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  override async detachDevice(uri: string, domain: string, xml: string, o: DeviceFlags): Promise<void> {
    await super.detachDevice(uri, domain, xml, o);
    const alias = /<alias name=["']([^"']+)["']/.exec(xml)?.[1];
    if (o.live && alias && this.#lv.domains.get(domain)?.unplugs)
      setImmediate(() =>
        this.emit({ type: 'device-removed', uri, domain, uuid: '347ba555-a2a7-4ec0-b250-4eedce37b6f1', alias }),
      );
  }
}
