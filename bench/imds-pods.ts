// A kubelet pods tree with one launcher pod per bench VMI, each holding a
// projected ServiceAccount token as the kubelet's atomic writer lays it out.
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { projectedToken, jwt } from '../test/datasource/imds-support.ts';

export function podUid(i: number): string {
  return `00000000-0000-4000-8000-${i.toString(16).padStart(12, '0')}`;
}

export async function benchPodsTree(vmis: number): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-bench-pods-'));
  const exp = Math.floor(Date.now() / 1000) + 3600;
  for (let i = 0; i < vmis; i++) await projectedToken(dir, podUid(i), jwt({ exp, sub: `vm-${i}` }));
  return dir;
}
