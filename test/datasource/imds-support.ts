// Shared by the IMDS endpoint tests: a kubelet pods tree laid out as the
// kubelet's atomic writer lays out a projected ServiceAccount token, JWTs,
// and requests from a chosen loopback source address with chosen headers.
import { request } from 'node:http';
import { mkdir, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Seed } from '../../src/cloudinit/seed.ts';
import type { SeedDirectoryEntry } from '../../src/datasource/types.ts';
import type { ImdsFacts } from '../../src/datasource/imds/identity-endpoint.ts';

export const TIMESTAMP_DIR = '..2026_11_25_23_00_00.123456789';

export function jwt(claims: Record<string, unknown>): string {
  const part = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url');
  return `${part({ alg: 'RS256', typ: 'JWT' })}.${part(claims)}.${Buffer.from('sig').toString('base64url')}`;
}

// A projected ServiceAccount token's claims as the API server signs them:
// /v1/token hands out only one whose kubernetes.io claims name the VMI's
// namespace, ServiceAccount and launcher pod.
export function launcherJwt(
  claims: Record<string, unknown>,
  who: { namespace: string; serviceAccount: string; pod: string; podName?: string },
): string {
  return jwt({
    ...claims,
    'kubernetes.io': {
      namespace: who.namespace,
      serviceaccount: { name: who.serviceAccount },
      pod: { name: who.podName ?? `virt-launcher-${who.pod.slice(0, 8)}`, uid: who.pod },
    },
  });
}

// <pods>/<pod>/volumes/kubernetes.io~projected/kube-api-access-<5>/{..<ts>/token, ..data -> ..<ts>, token -> ..data/token}
export async function projectedToken(podsDir: string, pod: string, token: string, volume = 'kube-api-access-x7k2p') {
  const dir = join(podsDir, pod, 'volumes', 'kubernetes.io~projected', volume);
  await mkdir(join(dir, TIMESTAMP_DIR), { recursive: true });
  await writeFile(join(dir, TIMESTAMP_DIR, 'token'), `${token}\n`, { mode: 0o600 });
  await symlink(TIMESTAMP_DIR, join(dir, '..data'));
  await symlink('..data/token', join(dir, 'token'));
  return dir;
}

export function facts(over: Partial<ImdsFacts> = {}): ImdsFacts {
  return { enabled: true, serviceAccountName: 'default', serviceAccountToken: false, launcherPods: [], ...over };
}

export function entry(name: string, seed: Seed, imds: ImdsFacts, namespace = 'tenant'): SeedDirectoryEntry {
  return { namespace, name, uid: `uid-${name}`, seed, imds };
}

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

// A GET from `from` (a 127.0.0.0/8 address) with exactly these headers.
export function get(
  port: number,
  path: string,
  headers: Record<string, string | string[]> = {},
  from = '127.0.0.1',
  method = 'GET',
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port, path, method, headers, localAddress: from, agent: false, timeout: 20_000 },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }),
        );
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error('request timed out')));
    req.on('error', reject);
    req.end();
  });
}
