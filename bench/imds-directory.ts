// The identity rows of bench:imds and bench:provisioning-events: the agent's
// own AgentSeedDirectory over the bench VMIs, with this node's launcher pods
// (each VMI's pod at launcherIp(i): every answer then requires the source to
// be that address, SeedDirectory.launcherAt) or without them (no launcher
// knowledge, launcherAt undefined: local mode, the datasource as before the
// identity checks).
import type { Seed } from '../src/cloudinit/seed.ts';
import type { VmiObject } from '../src/api/objects.ts';
import { AgentSeedDirectory } from '../src/datasource/directory.ts';
import type { NodePod, NodePods } from '../src/datasource/types.ts';
import { IMDS_OPT_IN } from '../src/datasource/imds/facts.ts';
import { launcherIp, launcherPodName, podUid } from './imds-pods.ts';

export const BENCH_NODE = 'bench-node';

export function benchDirectory(
  vmis: number,
  seedOf: (i: number) => Seed,
  launchers: boolean,
  ipOf: (i: number) => string = launcherIp,
): AgentSeedDirectory {
  const pods = new Map<string, NodePod>();
  for (let i = 0; i < vmis; i++)
    pods.set(podUid(i), {
      uid: podUid(i),
      name: launcherPodName(i),
      namespace: 'bench',
      owners: [`uid-${i}`],
      ips: [ipOf(i)],
    });
  const nodePods: NodePods = { revision: 1, get: (uid) => pods.get(uid) };
  const directory = new AgentSeedDirectory({
    onFetch: () => {},
    nodeName: BENCH_NODE,
    ...(launchers ? { pods: nodePods } : {}),
  });
  for (let i = 0; i < vmis; i++) {
    const vmi: VmiObject = {
      metadata: { namespace: 'bench', name: `vm-${i}`, uid: `uid-${i}`, annotations: { [IMDS_OPT_IN]: 'true' } },
      spec: { volumes: [{ name: 'sa', serviceAccount: { serviceAccountName: 'sa' } }] },
      status: { nodeName: BENCH_NODE, activePods: { [podUid(i)]: BENCH_NODE } },
    };
    directory.put(`bench/vm-${i}`, vmi, seedOf(i));
  }
  return directory;
}
