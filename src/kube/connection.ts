// Where the API server is and how to authenticate, from a kubeconfig file or
// the in-cluster service account. client-node's KubeConfig does this too,
// but importing it loads every generated API client, a large share of the
// agent's memory budget (measured: docs/operations.md, "The agent and the
// API server"); the agent needs one server, a CA, and a bearer token or
// client certificate.
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { Agent, buildConnector } from 'undici';
import { load as loadYaml } from 'js-yaml';
import { VmseedError } from '../errors.ts';

/** Where the kubelet mounts the pod's service-account token, CA and namespace. */
export const SA_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';
// Bound service-account tokens rotate: kubelet rewrites the projected file
// at 80% of the token's TTL (1 h by default, so after ~48 min), and the old
// token stays valid until it expires. client-go re-reads the file each
// minute (transport.NewCachedFileTokenSource); so does this, and at once
// after a 401.
const TOKEN_REREAD_MS = 60_000;
/** Streams per HTTP/2 connection: Go's HTTP/2 server default, which kube-apiserver keeps. */
export const H2_MAX_STREAMS = 250;
// A service-account JWT is ~1-2 KiB.
const MAX_TOKEN_BYTES = 64 * 1024;

// How long a CA file read is trusted before the file is looked at again.
const CA_REREAD_MS = 10_000;

// A connector whose CA is the file's current content: each new connection
// uses the file as it was at most `rereadMs` ago; a missing or empty file
// fails the connection (the caller's retry comes back), never the process.
function caFileConnector(path: string, tls: Record<string, unknown>, rereadMs: number): buildConnector.connector {
  let at = 0;
  let text: string | undefined;
  let connector: buildConnector.connector | undefined;
  return (options, callback) => {
    if (Date.now() - at >= rereadMs) {
      at = Date.now();
      let next: string | undefined;
      try {
        next = readFileSync(path, 'utf8');
      } catch {
        next = undefined;
      }
      if (next !== text) {
        text = next;
        connector = next?.trim() ? buildConnector({ ...tls, ca: next, allowH2: true }) : undefined;
      }
    }
    if (!connector) {
      callback(new Error(`no CA in ${path} yet`), null);
      return;
    }
    connector(options, callback);
  };
}

/**
 * Server, TLS and credentials of one connection, as a kubeconfig or the
 * in-cluster service account gives them (PEM text, not paths). A
 * `tokenFile` is re-read every `tokenRereadMs` (default 60 s) and after a 401.
 */
export interface ConnectionSpec {
  server: string;
  skipTLSVerify?: boolean;
  ca?: string;
  // A CA file re-read as it changes (a mounted ConfigMap the kubelet
  // updates); until it exists, connections fail and are retried.
  caFile?: string;
  caRereadMs?: number;
  cert?: string;
  key?: string;
  serverName?: string;
  token?: string;
  tokenFile?: string;
  tokenRereadMs?: number;
}

/**
 * One API server: its URL, the keep-alive pool every call and watch shares
 * (HTTP/2 when offered) and the current bearer token. The constructor throws
 * VmseedError CONFIG_INVALID (terminal) when `server` is not an http(s) URL.
 */
export class KubeConnection {
  readonly #spec: ConnectionSpec;
  readonly #dispatcher: Agent;
  #token: string | undefined;
  #tokenReadAt = 0;

  constructor(spec: ConnectionSpec) {
    if (!/^https?:\/\//.test(spec.server)) throw invalid(`server '${spec.server}' is not an http(s) URL`);
    this.#spec = spec;
    const tls = {
      ...(spec.ca ? { ca: spec.ca } : {}),
      ...(spec.cert ? { cert: spec.cert } : {}),
      ...(spec.key ? { key: spec.key } : {}),
      ...(spec.serverName ? { servername: spec.serverName } : {}),
      rejectUnauthorized: !spec.skipTLSVerify,
    };
    this.#dispatcher = new Agent({
      connect: spec.caFile ? caFileConnector(spec.caFile, tls, spec.caRereadMs ?? CA_REREAD_MS) : tls,
      keepAliveTimeout: 30_000,
      // HTTP/2 when the server offers it (the API server does): every watch
      // and call of the agent multiplexed on one connection, as kubelet's
      // are, instead of a connection held per open watch. A connection
      // carries as many streams as the lower of this and what the server
      // allows (kube-apiserver: 250 unless --http2-max-streams-per-connection
      // says otherwise); past that a second connection opens.
      allowH2: true,
      h2Options: { maxConcurrentStreams: H2_MAX_STREAMS },
    });
    this.#token = spec.token;
  }

  getCurrentCluster(): { name: string; server: string; skipTLSVerify: boolean } {
    return {
      name: 'vmseed',
      server: this.#spec.server.replace(/\/+$/, ''),
      skipTLSVerify: this.#spec.skipTLSVerify ?? false,
    };
  }

  get dispatcher(): Agent {
    return this.#dispatcher;
  }

  authHeaders(): Record<string, string> {
    const token = this.#currentToken();
    return token ? { Authorization: `Bearer ${token}` } : {};
  }

  // Lets in-flight calls finish, but not a watch that never ends.
  async close(graceMs = 2000): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), graceMs)));
    const closed = await Promise.race([this.#dispatcher.close().then(() => 'closed' as const), late]);
    clearTimeout(timer);
    if (closed === 'late') await this.#dispatcher.destroy();
  }

  // The API server said 401: read the token file again now (it may have
  // been rotated since the last read). True when that gave a different
  // token, so the call is worth one more try.
  tokenRejected(): boolean {
    if (!this.#spec.tokenFile) return false;
    const before = this.#token;
    this.#readToken();
    return this.#token !== undefined && this.#token !== before;
  }

  #currentToken(): string | undefined {
    const file = this.#spec.tokenFile;
    if (
      file &&
      (this.#token === undefined || Date.now() - this.#tokenReadAt > (this.#spec.tokenRereadMs ?? TOKEN_REREAD_MS))
    )
      this.#readToken();
    return this.#token;
  }

  // kubelet's projected volume makes `token` a symlink into its current
  // `..data` directory and swaps that directory on rotation: the path is
  // opened afresh each time, following that link by design.
  #readToken(): void {
    const file = this.#spec.tokenFile!;
    let fd: number | undefined;
    try {
      fd = openSync(file, 'r');
      const buf = Buffer.alloc(MAX_TOKEN_BYTES + 1);
      let n = 0;
      for (let r; n < buf.length && (r = readSync(fd, buf, n, buf.length - n, null)) > 0;) n += r;
      if (n > MAX_TOKEN_BYTES) return; // not a token; keep the last one
      const token = buf.subarray(0, n).toString('utf8').trim();
      if (token !== '') this.#token = token;
      this.#tokenReadAt = Date.now();
    } catch {
      // Keep the last token; the API server will say 401 if it expired.
    } finally {
      if (fd !== undefined) closeSync(fd);
    }
  }
}

function invalid(message: string): VmseedError {
  return new VmseedError('CONFIG_INVALID', `kubeconfig: ${message}`, { kind: 'terminal', field: 'kubeconfig' });
}

/**
 * The in-cluster connection, as client-go's rest.InClusterConfig builds it.
 * Throws VmseedError CONFIG_INVALID when KUBERNETES_SERVICE_HOST is unset or
 * the service account's ca.crt cannot be read.
 */
export function inClusterConnection(env: NodeJS.ProcessEnv = process.env, saDir = SA_DIR): KubeConnection {
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT ?? '443';
  if (!host) throw invalid('no --kubeconfig given and not running in a cluster (KUBERNETES_SERVICE_HOST is not set)');
  let ca: string;
  try {
    ca = readFileSync(`${saDir}/ca.crt`, 'utf8');
  } catch {
    throw invalid(`no service-account CA at ${saDir}/ca.crt; mount the service account token or pass --kubeconfig`);
  }
  // client-go's rest.InClusterConfig: the CA from ca.crt only (a server
  // certificate from another CA is refused), the token from its file.
  return new KubeConnection({
    server: `https://${host.includes(':') ? `[${host}]` : host}:${port}`,
    ca,
    tokenFile: `${saDir}/token`,
  });
}

type Named<T> = { name: string } & T;

/**
 * The current context of the kubeconfig at `path`: token, token file, client
 * certificate and CA, as files or inline data. Throws VmseedError
 * CONFIG_INVALID (terminal) for an unreadable file, a missing context or
 * cluster, or an exec or auth-provider plugin, which vmseed does not run.
 */
export function connectionFromKubeconfig(path: string): KubeConnection {
  let doc: Record<string, unknown>;
  try {
    doc = loadYaml(readFileSync(path, 'utf8')) as Record<string, unknown>;
  } catch (e) {
    throw invalid(`cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? 'not YAML'}`);
  }
  const base = dirname(path);
  const file = (p: unknown) => readFileSync(resolve(base, String(p)), 'utf8');
  const list = <T>(k: string) => (Array.isArray(doc?.[k]) ? (doc[k] as Array<Named<T>>) : []);
  const ctxName = doc?.['current-context'];
  const context = list<{ context?: { cluster?: string; user?: string } }>('contexts').find(
    (c) => c.name === ctxName,
  )?.context;
  if (!context) throw invalid(`${path}: current-context '${String(ctxName)}' not found`);
  const cluster = list<{ cluster?: Record<string, unknown> }>('clusters').find(
    (c) => c.name === context.cluster,
  )?.cluster;
  if (!cluster || typeof cluster.server !== 'string')
    throw invalid(`${path}: cluster '${String(context.cluster)}' has no server`);
  const user = list<{ user?: Record<string, unknown> }>('users').find((u) => u.name === context.user)?.user ?? {};
  if (user.exec || user['auth-provider'])
    throw invalid(
      `${path}: user '${String(context.user)}' uses an exec or auth-provider plugin, which vmseed does not run; use a token or a client certificate`,
    );
  const pick = (data: unknown, ref: unknown): string | undefined =>
    typeof data === 'string'
      ? Buffer.from(data, 'base64').toString('utf8')
      : typeof ref === 'string'
        ? file(ref)
        : undefined;
  try {
    const spec: ConnectionSpec = {
      server: cluster.server,
      skipTLSVerify: cluster['insecure-skip-tls-verify'] === true,
    };
    const ca = pick(cluster['certificate-authority-data'], cluster['certificate-authority']);
    const cert = pick(user['client-certificate-data'], user['client-certificate']);
    const key = pick(user['client-key-data'], user['client-key']);
    if (ca) spec.ca = ca;
    if (cert) spec.cert = cert;
    if (key) spec.key = key;
    if (typeof cluster['tls-server-name'] === 'string') spec.serverName = cluster['tls-server-name'];
    if (typeof user.token === 'string') spec.token = user.token;
    if (typeof user.tokenFile === 'string') spec.tokenFile = resolve(base, user.tokenFile);
    return new KubeConnection(spec);
  } catch (e) {
    if (e instanceof VmseedError) throw e;
    throw invalid(`${path}: cannot read a referenced file (${(e as NodeJS.ErrnoException).code ?? 'error'})`);
  }
}

/**
 * `--kubeconfig` when given, else the in-cluster service account; throws as
 * connectionFromKubeconfig and inClusterConnection do.
 */
export function loadConnection(kubeconfig: string | undefined, env: NodeJS.ProcessEnv = process.env): KubeConnection {
  return kubeconfig ? connectionFromKubeconfig(kubeconfig) : inClusterConnection(env);
}
