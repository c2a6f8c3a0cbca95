// An agent in local mode, in-process: the real LocalDirSource (chokidar on
// a temporary directory), renderer, ISO builder and image store. Stopped
// (watcher included) before its directory is removed.
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Agent } from '../../src/agent/controller.ts';
import { LogEventRecorder } from '../../src/agent/events.ts';
import { LocalDirSource, type LocalSourceOptions } from '../../src/agent/local/local-vmi-source.ts';
import { renderSeed } from '../../src/cloudinit/render.ts';
import { buildSeedImage } from '../../src/disk/seed-image.ts';
import { ImageStore } from '../../src/disk/store.ts';
import type { Injector } from '../../src/libvirt/injector-contract.ts';
import type { Metrics } from '../../src/metrics/metrics.ts';
import { captureLogger } from './capture-logger.ts';
import { tempDir } from './agent-harness.ts';

export interface LocalAgent {
  agent: Agent;
  // The watched directory (empty at first unless `files` are given).
  manifests: string;
  lines: string[];
}

export async function startLocalAgent(
  t: { after(fn: () => Promise<void>): void },
  options: {
    settleMs: number;
    files?: Record<string, string>;
    injector?: Injector;
    metrics?: Metrics;
    watch?: LocalSourceOptions['watch'];
  },
): Promise<LocalAgent> {
  const dir = await tempDir('vmseed-local-agent-');
  const manifests = join(dir.path, 'manifests');
  const state = join(dir.path, 'seeds');
  await mkdir(manifests);
  for (const [name, text] of Object.entries(options.files ?? {})) await writeFile(join(manifests, name), text);
  const { logger, lines } = captureLogger('info');
  const agent = new Agent({
    version: 'test',
    nodeName: 'node-a',
    stateDir: state,
    config: {},
    makeSource: (onKey) =>
      new LocalDirSource({
        dir: manifests,
        logger,
        onKey,
        settleMs: options.settleMs,
        ...(options.watch ? { watch: options.watch } : {}),
      }),
    refs: (source) => source as LocalDirSource,
    render: renderSeed,
    build: buildSeedImage,
    store: new ImageStore({ root: state }),
    ...(options.injector ? { injector: options.injector } : {}),
    events: new LogEventRecorder(logger),
    ...(options.metrics ? { metrics: options.metrics } : {}),
    logger,
    concurrency: 4,
    renderOptions: { kubevirtVolumes: 'own', maxUserDataBytes: 1 << 20, maxNetworkDataBytes: 1 << 16 },
    resyncPeriodMs: 600_000,
    retryBackoff: { baseMs: 20, maxMs: 200 },
    fsync: false,
  });
  t.after(async () => {
    await agent.stop(2000);
    await dir.remove();
  });
  await agent.start();
  return { agent, manifests, lines };
}

// A VMI manifest whose user-data is `#cloud-config` and `body`.
export function vmiManifest(name: string, body: string, namespace = 'default'): string {
  const indented = body
    .split('\n')
    .map((l) => `        ${l}`)
    .join('\n');
  return `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: ${name}
  namespace: ${namespace}
  annotations:
    vmseed.io/cloud-init: |
      userData: |
        #cloud-config
${indented}
spec:
  domain: {}
`;
}
