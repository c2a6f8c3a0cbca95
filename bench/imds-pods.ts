// A kubelet pods tree with one launcher pod per bench VMI, each holding a
// projected ServiceAccount token as the kubelet's atomic writer lays it out.
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { projectedToken, jwt } from '../test/datasource/imds-support.ts';

export function podUid(i: number): string {
  return `00000000-0000-4000-8000-${i.toString(16).padStart(12, '0')}`;
}

// The launcher pod IP of bench VMI i in the identity rows: a loopback
// address of its own (127.0.1.10 onwards; Linux answers all of 127/8).
export function launcherIp(i: number): string {
  return `127.0.${1 + Math.floor(i / 240)}.${10 + (i % 240)}`;
}

export function launcherPodName(i: number): string {
  return `virt-launcher-vm-${i}-abcde`;
}

export async function benchPodsTree(vmis: number): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-bench-pods-'));
  const exp = Math.floor(Date.now() / 1000) + 3600;
  // The claims the token endpoint checks (tokenMismatch): the VMI's
  // namespace, its ServiceAccount, its launcher pod (imds-directory.ts).
  for (let i = 0; i < vmis; i++)
    await projectedToken(
      dir,
      podUid(i),
      jwt({
        exp,
        sub: `system:serviceaccount:bench:sa`,
        'kubernetes.io': {
          namespace: 'bench',
          serviceaccount: { name: 'sa' },
          pod: { name: launcherPodName(i), uid: podUid(i) },
        },
      }),
    );
  return dir;
}
