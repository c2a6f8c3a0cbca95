// A kubeconfig read as kubectl reads it, by client-node's KubeConfig:
// KUBECONFIG lists merged, any context, exec credential plugins and OIDC
// auth-providers (their tokens fetched and refreshed by client-node), and
// proxy-url. Only connection.ts's loadConnection imports this module, and
// only when there is a kubeconfig, so the in-cluster agent never loads
// client-node (see test/kube/kubeconfig-lazy.test.ts).
import { accessSync, closeSync, constants, fstatSync, openSync, readFileSync } from 'node:fs';
import { delimiter, dirname, isAbsolute, join, resolve, sep } from 'node:path';
import { load as loadYaml } from 'js-yaml';
import type { Cluster, KubeConfig, User } from '@kubernetes/client-node';
import { VmseedError } from '../errors.ts';
import { invalid, type ConnectionSpec, type CredentialSource } from './connection-spec.ts';

type Entry = { name?: unknown } & Record<string, unknown>;
type Doc = { clusters: Entry[]; users: Entry[]; contexts: Entry[]; 'current-context'?: string };

// After a 401 the exec plugin is run again at most this often: an API
// server that refuses every token must not have it run once per request.
const EXEC_RERUN_MS = 10_000;

// What an exec plugin or OIDC provider says when it fails goes into the
// request's error; bounded, as a log line is.
const MAX_PLUGIN_MESSAGE = 300;

// A kubeconfig and the PEM files it names are KiB; the size is checked
// before a file is read, so a wrong path (a disk image, /dev/zero) is a
// clear error, not the agent's memory.
const MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024;
const MAX_PEM_BYTES = 1024 * 1024;

function readBounded(file: string, max: number): string {
  const fd = openSync(file, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw invalid(`${file}: not a regular file`);
    if (st.size > max) throw invalid(`${file}: ${st.size} bytes, more than the ${max} a kubeconfig file may have`);
    return readFileSync(fd, 'utf8');
  } finally {
    closeSync(fd);
  }
}

/**
 * The connection spec of a kubeconfig: `paths` one file or a `:`-separated list,
 * merged as kubectl merges KUBECONFIG (the first file to name a cluster, user
 * or context wins, as does the first current-context; listed files that do
 * not exist are skipped; relative paths are relative to the file that holds
 * them). `context` replaces the current context. Throws VmseedError
 * CONFIG_INVALID with field 'kubeconfig' (or 'context' for an unknown
 * `context`) for an unreadable or malformed file, a missing context,
 * cluster or server, or a referenced file that cannot be read.
 */
export async function kubeconfigSpec(paths: string, options: { context?: string } = {}): Promise<ConnectionSpec> {
  const files = paths
    .split(delimiter)
    .filter((p) => p !== '')
    .map((p) => resolve(p));
  const doc = mergeFiles(files);
  const where = files.join(delimiter);
  const { KubeConfig } = await import('@kubernetes/client-node');
  const kc = new KubeConfig();
  try {
    kc.loadFromString(JSON.stringify(doc));
  } catch (e) {
    throw invalid(`${where}: ${(e as Error).message}`);
  }
  const contextName = options.context ?? kc.getCurrentContext();
  const context = contextName ? kc.getContextObject(contextName) : null;
  if (!context) {
    const known = kc.getContexts().map((c) => c.name);
    const names = known.length > 0 ? `; it has ${known.join(', ')}` : '';
    if (options.context !== undefined)
      throw invalid(`context '${options.context}' is not in ${where}${names}`, 'context');
    throw invalid(
      contextName
        ? `${where}: current-context '${contextName}' not found${names}`
        : `${where}: no current-context; set one (kubectl config use-context) or name a context`,
    );
  }
  kc.setCurrentContext(context.name);
  const cluster = kc.getCluster(context.cluster);
  if (!cluster)
    throw invalid(`${where}: context '${context.name}' names cluster '${context.cluster}', which is not there`);
  const user = kc.getUser(context.user);
  if (context.user && !user)
    throw invalid(`${where}: context '${context.name}' names user '${context.user}', which is not there`);
  const rawUser = doc.users.find((u) => u.name === context.user)?.user as Record<string, unknown> | undefined;

  const spec: ConnectionSpec = { server: cluster.server, skipTLSVerify: cluster.skipTLSVerify };
  try {
    const ca = pem(cluster.caFile, cluster.caData);
    const cert = pem(user?.certFile, user?.certData);
    const key = pem(user?.keyFile, user?.keyData);
    if (ca) spec.ca = ca;
    if (cert) spec.cert = cert;
    if (key) spec.key = key;
  } catch (e) {
    if (e instanceof VmseedError) throw e;
    throw invalid(`${where}: cannot read a referenced file (${(e as NodeJS.ErrnoException).code ?? 'error'})`);
  }
  if (cluster.tlsServerName) spec.serverName = cluster.tlsServerName;
  if (cluster.proxyUrl) {
    if (!/^(https?|socks5?):\/\//.test(cluster.proxyUrl))
      throw invalid(`${where}: cluster '${cluster.name}' proxy-url is not an http, https or socks5 URL`);
    spec.proxyUrl = cluster.proxyUrl;
  }
  const headers: Record<string, string> = {};
  if (user?.username)
    headers.Authorization = `Basic ${Buffer.from(`${user.username}:${user.password ?? ''}`).toString('base64')}`;
  if (user?.impersonateUser) headers['Impersonate-User'] = user.impersonateUser;
  if (user && (user.exec || user.authProvider)) {
    if (user.exec) checkExecCommand(user.name, user.exec as ExecSpec);
    delete headers.Authorization;
    spec.credentials = fetchedCredentials(KubeConfig, cluster, user, context.name);
  } else if (user?.token) {
    spec.token = user.token;
  } else if (typeof rawUser?.tokenFile === 'string') {
    spec.tokenFile = rawUser.tokenFile;
  }
  if (Object.keys(headers).length > 0) spec.headers = headers;
  if (!/^https?:\/\//.test(spec.server)) throw invalid(`server '${spec.server}' is not an http(s) URL`);
  return spec;
}

type ExecSpec = { command?: unknown; env?: Array<{ name?: unknown; value?: unknown }>; installHint?: unknown };

// A plugin that is not installed is a setup error, told at start (with the
// kubeconfig's installHint, as kubectl tells it) rather than by every
// request failing. The command is looked up as spawn will: in the PATH the
// plugin gets (its env may set one), or as a path.
function checkExecCommand(userName: string, exec: ExecSpec): void {
  const command = exec.command;
  if (typeof command !== 'string' || command === '') throw invalid(`user '${userName}': exec has no command`);
  const runnable = (p: string) => {
    try {
      accessSync(p, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  };
  const pathVar = exec.env?.find((e) => e?.name === 'PATH')?.value ?? process.env.PATH ?? '';
  const found = command.includes(sep)
    ? runnable(resolve(command))
    : String(pathVar)
        .split(delimiter)
        .some((dir) => dir !== '' && runnable(join(dir, command)));
  if (!found) {
    const hint =
      typeof exec.installHint === 'string' ? `: ${exec.installHint.trim().slice(0, MAX_PLUGIN_MESSAGE)}` : '';
    throw invalid(
      `user '${userName}': exec plugin command '${command}' is not found (${command.includes(sep) ? 'no executable file there' : 'not in PATH'}); install it or fix users[].user.exec.command${hint}`,
    );
  }
}

// Inline data wins over a file, as in client-go (client-node has it the
// other way round).
function pem(file: string | undefined | null, data: string | undefined | null): string | undefined {
  if (data) return Buffer.from(data, 'base64').toString('utf8');
  if (file) return readBounded(file, MAX_PEM_BYTES);
  return undefined;
}

// kubectl's merge (client-go's ClientConfigLoadingRules.Load), on the YAML
// as written, with each file's relative paths made absolute first.
function mergeFiles(files: string[]): Doc {
  if (files.length === 0) throw invalid('no kubeconfig file named');
  const merged: Doc = { clusters: [], users: [], contexts: [] };
  let found = 0;
  for (const file of files) {
    let text: string;
    try {
      text = readBounded(file, MAX_KUBECONFIG_BYTES);
    } catch (e) {
      if (e instanceof VmseedError) throw e;
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' && files.length > 1) continue;
      throw invalid(`cannot read ${file}: ${code ?? 'error'}`);
    }
    found++;
    let doc: unknown;
    try {
      doc = loadYaml(text);
    } catch {
      throw invalid(`${file}: not YAML`);
    }
    if (doc === undefined || doc === null) continue;
    if (typeof doc !== 'object' || Array.isArray(doc)) throw invalid(`${file}: not a kubeconfig (a YAML mapping)`);
    const d = doc as Record<string, unknown>;
    const base = dirname(file);
    for (const key of ['clusters', 'users', 'contexts'] as const) {
      const list = d[key];
      if (list === undefined || list === null) continue;
      if (!Array.isArray(list)) throw invalid(`${file}: ${key} is not a list`);
      for (const entry of list as unknown[]) {
        if (!entry || typeof entry !== 'object' || typeof (entry as Entry).name !== 'string')
          throw invalid(`${file}: an entry of ${key} has no name`);
        const e = entry as Entry;
        if (merged[key].some((m) => m.name === e.name)) continue;
        merged[key].push(absolutePaths(key, e, base));
      }
    }
    const current = d['current-context'];
    if (merged['current-context'] === undefined && typeof current === 'string' && current !== '')
      merged['current-context'] = current;
  }
  if (found === 0) throw invalid(`none of ${files.join(delimiter)} exists`);
  return merged;
}

// client-go's ResolvePaths: file references, and an exec command that is a
// path (has a separator) rather than a name looked up in PATH.
function absolutePaths(key: 'clusters' | 'users' | 'contexts', entry: Entry, base: string): Entry {
  const inner = key === 'clusters' ? 'cluster' : key === 'users' ? 'user' : undefined;
  const body = inner ? entry[inner] : undefined;
  if (!inner || !body || typeof body !== 'object') return entry;
  const copy: Record<string, unknown> = { ...(body as Record<string, unknown>) };
  const fix = (k: string) => {
    if (typeof copy[k] === 'string' && copy[k] !== '' && !isAbsolute(copy[k])) copy[k] = resolve(base, copy[k]);
  };
  if (inner === 'cluster') fix('certificate-authority');
  else {
    for (const k of ['client-certificate', 'client-key', 'tokenFile']) fix(k);
    const exec = copy.exec as Record<string, unknown> | undefined;
    if (exec && typeof exec.command === 'string' && exec.command.includes(sep) && !isAbsolute(exec.command))
      copy.exec = { ...exec, command: resolve(base, exec.command) };
  }
  return { ...entry, [inner]: copy };
}

// The user's exec plugin or auth-provider through client-node: it runs the
// plugin when it has no credential or the last one's expirationTimestamp
// has passed, and refreshes an OIDC id-token when it expires. It gets this
// user alone, with no certificate files, so asking it per request reads no
// file. Concurrent requests share one plugin run.
function fetchedCredentials(
  KubeConfigClass: typeof KubeConfig,
  cluster: Cluster,
  user: User,
  contextName: string,
): CredentialSource {
  const fresh = (): KubeConfig => {
    const kc = new KubeConfigClass();
    kc.loadFromOptions({
      clusters: [{ name: cluster.name, server: cluster.server, skipTLSVerify: cluster.skipTLSVerify }],
      users: [{ ...user, certData: undefined, certFile: undefined, keyData: undefined, keyFile: undefined }],
      contexts: [{ name: contextName, cluster: cluster.name, user: user.name }],
      currentContext: contextName,
    });
    return kc;
  };
  let kc = fresh();
  let pending: Promise<Record<string, string>> | undefined;
  let rerunAt = 0;
  const isExec = Boolean(user.exec || (user.authProvider as { config?: { exec?: unknown } } | undefined)?.config?.exec);
  const ask = async (): Promise<Record<string, string>> => {
    const opts: { headers?: Record<string, unknown>; cert?: unknown } = {};
    try {
      await kc.applyToHTTPSOptions(opts);
    } catch (e) {
      // A plain Error: it fails this request, and the caller's transport
      // error (KUBE_API_UNAVAILABLE, retried) quotes its message.
      const what = isExec ? 'exec plugin' : 'auth-provider';
      const why = String((e as Error)?.message ?? e)
        .trim()
        .slice(0, MAX_PLUGIN_MESSAGE);
      throw new Error(`kubeconfig user '${user.name}': the ${what} failed: ${why || 'no message'}`, { cause: e });
    }
    if (opts.cert)
      throw new Error(
        `kubeconfig user '${user.name}': the exec plugin returned a client certificate; vmseed takes only a token from a plugin (give the certificate as client-certificate/client-key)`,
      );
    const out: Record<string, string> = {};
    for (const [k, v] of Object.entries(opts.headers ?? {})) if (typeof v === 'string') out[k] = v;
    return out;
  };
  return {
    headers: () => (pending ??= ask().finally(() => (pending = undefined))),
    rejected: () => {
      // An OIDC id-token is refreshed when it expires, not when refused.
      if (!isExec || Date.now() - rerunAt < EXEC_RERUN_MS) return false;
      rerunAt = Date.now();
      kc = fresh();
      return true;
    },
  };
}
