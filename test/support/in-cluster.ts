// Start a process the way kubelet starts the agent's container, as far as
// the Kubernetes API goes: KUBERNETES_SERVICE_HOST/PORT pointing at a fake
// API server, and the service-account volume (token, ca.crt, namespace) at
// its usual path, /var/run/secrets/kubernetes.io/serviceaccount, laid out
// as kubelet's projected volume lays it out (AtomicWriter: the files are
// symlinks into `..data`, a symlink to a timestamped directory swapped in
// one rename on each update).
//
// The path is made visible to the child only: the command runs under
// `unshare -m` (a private mount namespace) with the directory bind-mounted
// over that path, then `exec`s the real command. Needs root (CAP_SYS_ADMIN)
// for unshare/mount; whatever the command does next (e.g. `setpriv` to the
// DaemonSet's user, groups and capabilities) runs after the mount.
//
// API:
//   const sa = await serviceAccountVolume(fake, dir, { namespace?, token? })
//     writes the volume under `dir` (ca.crt = the fake's CA, token = an
//     accepted one; the fake is told to accept only that token). With
//     `account` (another pod's service account, e.g. the cluster
//     component's vmseed/vmseed-cluster), the token is one the fake
//     authenticates as that account (fake.serviceAccountToken()), and the
//     agent's accepted tokens are left alone.
//   sa.command(argv): [file, ...args] that runs `argv` with the volume
//     mounted at SA_PATH; spawn(file, args, { env: sa.env(extraEnv) }).
//   sa.env(extra?): process.env without KUBECONFIG, plus
//     KUBERNETES_SERVICE_HOST=127.0.0.1 and KUBERNETES_SERVICE_PORT.
//   sa.rotateToken(): a new token, written as kubelet would; the fake then
//     accepts only the new one (the old one "expired"). Returns it.
//   sa.setCa(pem): replace ca.crt (e.g. another CA, to see it refused).
//   sa.path: the directory on the host.
// Files are 0644 and directories 0755 (kubelet's defaultMode 0644), so a
// non-root agent (uid 107) reads them.
import { chmod, mkdir, readdir, rename, rm, symlink, writeFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import type { FakeKube } from './fake-kube.ts';

export const SA_PATH = '/var/run/secrets/kubernetes.io/serviceaccount';

export interface ServiceAccountVolume {
  path: string;
  token: string;
  command(argv: string[]): string[];
  env(extra?: NodeJS.ProcessEnv): NodeJS.ProcessEnv;
  rotateToken(): Promise<string>;
  setCa(pem: string): Promise<void>;
}

const FILES = ['ca.crt', 'namespace', 'token'] as const;

export async function serviceAccountVolume(
  fake: FakeKube,
  dir: string,
  options: { namespace?: string; token?: string; account?: { namespace: string; name: string } } = {},
): Promise<ServiceAccountVolume> {
  const path = join(dir, 'serviceaccount');
  await mkdir(path, { recursive: true });
  await chmod(path, 0o755);
  const caCert = fake.caCert;
  if (!caCert) throw new Error('serviceAccountVolume needs the fake API server with TLS');
  const content: Record<(typeof FILES)[number], string> = {
    'ca.crt': caCert,
    namespace: options.namespace ?? options.account?.namespace ?? 'vmseed',
    token: options.token ?? newToken(),
  };
  const account = options.account;
  const accept = (token: string): string => {
    if (!account) {
      fake.acceptTokens(token);
      return token;
    }
    return fake.serviceAccountToken(account.namespace, account.name);
  };
  let generation = 0;

  // kubelet's AtomicWriter: write a new ..<ts> directory, point ..data at
  // it with one rename, link the user-visible names once, drop the old one.
  const publish = async () => {
    const ts = `..${new Date().toISOString().replace(/[-:.]/g, '_')}.${generation++}`;
    const tsDir = join(path, ts);
    await mkdir(tsDir, { mode: 0o755 });
    await chmod(tsDir, 0o755);
    for (const f of FILES) {
      await writeFile(join(tsDir, f), content[f], { mode: 0o644 });
      await chmod(join(tsDir, f), 0o644);
    }
    await symlink(ts, join(path, '..data_tmp'));
    await rename(join(path, '..data_tmp'), join(path, '..data'));
    for (const f of FILES)
      await symlink(join('..data', f), join(path, f)).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== 'EEXIST') throw e;
      });
    for (const old of await readdir(path))
      if (old.startsWith('..') && old !== ts && old !== '..data')
        await rm(join(path, old), { recursive: true, force: true });
  };
  content.token = accept(content.token);
  await publish();

  return {
    path,
    get token() {
      return content.token;
    },
    command: (argv) => [
      'unshare',
      '-m',
      '--propagation',
      'private',
      '--',
      'sh',
      '-c',
      `mkdir -p ${SA_PATH} && mount --bind "$0" ${SA_PATH} && exec "$@"`,
      path,
      ...argv,
    ],
    env: (extra = {}) => {
      const env: NodeJS.ProcessEnv = {
        ...process.env,
        KUBERNETES_SERVICE_HOST: '127.0.0.1',
        KUBERNETES_SERVICE_PORT: String(fake.port),
        ...extra,
      };
      delete env.KUBECONFIG;
      return env;
    },
    rotateToken: async () => {
      content.token = accept(newToken());
      await publish();
      return content.token;
    },
    setCa: async (pem) => {
      content['ca.crt'] = pem;
      await publish();
    },
  };
}

// Shaped like a JWT, random: tests can grep for it.
function newToken(): string {
  const b64 = (b: Buffer) => b.toString('base64url');
  return `${b64(Buffer.from('{"alg":"RS256","kid":"fake"}'))}.${b64(randomBytes(48))}.${b64(randomBytes(32))}`;
}
