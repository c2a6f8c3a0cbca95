// A StatusSource that tests drive by hand: plain data, no agent behind it.
import type { AgentStatusSnapshot, StatusSource, VmiStatusRecord } from '../../src/status/snapshot.ts';

export const T0 = '2026-11-22T03:00:00.000Z';

export function vmi(
  partial: Partial<VmiStatusRecord> & Pick<VmiStatusRecord, 'namespace' | 'name' | 'state'>,
): VmiStatusRecord {
  return { uid: `uid-${partial.namespace}-${partial.name}`, warnings: [], retries: 0, ...partial };
}

export function sampleSnapshot(): AgentStatusSnapshot {
  return {
    version: '0.1.0-test',
    nodeName: 'node-a',
    startedAt: '2026-11-22T02:00:00.000Z',
    config: {
      mode: 'local',
      listen: '127.0.0.1:0',
      stateDir: '/var/lib/vmseed',
      kubevirtVolumes: 'own',
      resync: 300,
      libvirt: true,
    },
    watch: {
      mode: 'local',
      synced: true,
      connected: true,
      stale: false,
      restarts: 1,
      lastEventAt: '2026-11-22T02:59:30.000Z',
    },
    queue: { depth: 2, inFlight: 1 },
    vmis: [
      vmi({
        namespace: 'default',
        name: 'web-1',
        state: 'ready',
        datasource: 'nocloud',
        imagePath: '/var/lib/vmseed/images/default_web-1.iso',
        imageBytes: 36864,
        contentHash: 'a3f1c2d4e5b60718293a4b5c6d7e8f90112233445566778899aabbccddeeff00',
        generatedAt: '2026-11-22T02:58:00.000Z',
        generationSeconds: 0.00342,
        files: [
          { path: 'meta-data', size: 58 },
          { path: 'user-data', size: 912 },
          { path: 'network-config', size: 140 },
        ],
        injection: {
          domain: 'default_web-1',
          targetDev: 'sdz',
          bus: 'scsi',
          flags: ['--live', '--config'],
          domainState: 'paused',
          seededAfterBoot: false,
          resumed: true,
          at: '2026-11-22T02:58:00.100Z',
        },
      }),
      vmi({
        namespace: 'tenant-b',
        name: 'db-0',
        state: 'error',
        datasource: 'configdrive',
        retries: 4,
        lastError: {
          code: 'SECRET_NOT_FOUND',
          message:
            'Secret tenant-b/db-userdata referenced by secretRef does not exist; create it or fix secretRef.name',
          kind: 'retryable',
          field: 'secretRef',
          at: '2026-11-22T02:59:50.000Z',
        },
      }),
      vmi({
        namespace: 'default',
        name: 'batch-7',
        state: 'warning',
        datasource: 'nocloud',
        imagePath: '/var/lib/vmseed/images/default_batch-7.iso',
        imageBytes: 20480,
        contentHash: '0f0e0d0c0b0a09080706050403020100ffeeddccbbaa99887766554433221100',
        generatedAt: '2026-11-22T02:40:00.000Z',
        generationSeconds: 0.0121,
        files: [
          { path: 'meta-data', size: 40 },
          { path: 'user-data', size: 30 },
        ],
        injection: {
          domain: 'default_batch-7',
          targetDev: 'vdz',
          bus: 'virtio',
          flags: ['--live'],
          domainState: 'running',
          seededAfterBoot: true,
          resumed: false,
          at: '2026-11-22T02:40:00.050Z',
        },
        warnings: [
          {
            code: 'SEEDED_AFTER_BOOT',
            message: 'the domain was already running; cloud-init may have booted without this seed',
            at: '2026-11-22T02:40:00.050Z',
          },
        ],
      }),
      vmi({ namespace: 'default', name: 'new-vm', state: 'pending' }),
      vmi({ namespace: 'kube-system', name: 'plain', state: 'skipped' }),
    ],
    recentGenerations: [0.0021, 0.0034, 0.0019, 0.0121, 0.0042, 0.0088, 0.0031].map((seconds, i) => ({
      at: new Date(Date.parse('2026-11-22T02:50:00.000Z') + i * 60_000).toISOString(),
      seconds,
    })),
  };
}

export class FakeStatusSource implements StatusSource {
  current: AgentStatusSnapshot;
  ready: { ready: boolean; reasons: string[] } = { ready: true, reasons: [] };
  readinessError: Error | undefined;
  snapshotError: Error | undefined;
  readinessCalls = 0;

  constructor(snapshot: AgentStatusSnapshot = sampleSnapshot()) {
    this.current = snapshot;
  }

  snapshot(): AgentStatusSnapshot {
    if (this.snapshotError) throw this.snapshotError;
    return this.current;
  }

  async readiness(): Promise<{ ready: boolean; reasons: string[] }> {
    this.readinessCalls++;
    if (this.readinessError) throw this.readinessError;
    return this.ready;
  }
}
