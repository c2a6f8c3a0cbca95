// Doubles for the guest's first read of its seed disk (src/agent/domain/seed-read.ts):
// a libvirt client whose events and block statistics the test drives, and
// an injector that reports an attach as the KubeVirt path does.
import type { BlockStats, LibvirtEvent } from '../../src/libvirt/libvirt-client.ts';
import type { VmseedError } from '../../src/errors.ts';
import type { InjectionResult, InjectionTarget } from '../../src/libvirt/injector-contract.ts';
import { RecordingInjector } from './agent-harness.ts';

export const URI = 'qemu+unix:///session?socket=/pods/p1/sock';

// A libvirt client double: events pushed by the test, block stats answered
// from `reads` (per target) or by `fail`.
export class FakeClient {
  readonly listeners = new Set<(e: LibvirtEvent) => void>();
  readonly calls: Array<{ at: number; domain: string; target: string }> = [];
  reads = 0;
  fail: VmseedError | undefined;

  onEvent(l: (e: LibvirtEvent) => void): () => void {
    this.listeners.add(l);
    return () => this.listeners.delete(l);
  }

  emit(domain: string, event: string, uri = URI): void {
    for (const l of this.listeners) l({ type: 'lifecycle', uri, domain, uuid: '', event, detail: 0 });
  }

  async blockStats(_uri: string, domain: string, target: string): Promise<BlockStats> {
    this.calls.push({ at: Date.now(), domain, target });
    if (this.fail) throw this.fail;
    return { rdReq: this.reads, rdBytes: this.reads * 4096, wrReq: 0, wrBytes: 0, errs: -1 };
  }
}

// The injector as the KubeVirt path reports an attach: where and when.
export class AttachingInjector extends RecordingInjector {
  running = false;
  override async inject(t: InjectionTarget, imagePath: string): Promise<InjectionResult> {
    const r = await super.inject(t, imagePath);
    return {
      ...r,
      targetDev: 'sdzz',
      flags: ['--live'],
      domainState: this.running ? 'running' : 'paused',
      seededAfterBoot: this.running && r.action !== 'none',
      uri: URI,
      ...(r.action === 'attached' ? { attachedAt: Date.now() } : {}),
    };
  }
}
