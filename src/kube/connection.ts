// Where the API server is and how to authenticate: the in-cluster service
// account, or a kubeconfig. A kubeconfig is read by client-node's KubeConfig
// (exec plugins, OIDC, merged KUBECONFIG lists, proxy-url, as kubectl reads
// them), imported only on that path: importing it loads every generated API
// client, a large share of the agent's memory budget (measured:
// docs/operations.md, "The agent and the API server"), which the in-cluster
// agent does not pay. Either way requests go through this module's undici
// pool, so HTTP/2 and the token and CA re-reads are the same.
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import { Agent, buildConnector, ProxyAgent, type Dispatcher } from 'undici';
import { invalid, type ConnectionSpec, type CredentialSource } from './connection-spec.ts';

export type { ConnectionSpec, CredentialSource } from './connection-spec.ts';

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

// Header names already in a dispatch's headers (any of the forms undici
// passes) are replaced by `extra`'s.
function withHeaders(headers: unknown, extra: Record<string, string>): string[] {
  const replace = new Set(Object.keys(extra).map((k) => k.toLowerCase()));
  const out: string[] = [];
  const add = (k: unknown, v: unknown) => {
    if (replace.has(String(k).toLowerCase())) return;
    if (Array.isArray(v)) for (const one of v) out.push(String(k), String(one));
    else if (v !== undefined && v !== null) out.push(String(k), String(v));
  };
  if (Array.isArray(headers)) {
    if (headers.length > 0 && Array.isArray(headers[0]))
      for (const [k, v] of headers as Array<[unknown, unknown]>) add(k, v);
    else for (let i = 0; i + 1 < headers.length; i += 2) add(headers[i], headers[i + 1]);
  } else if (headers && typeof headers === 'object') {
    const entries =
      Symbol.iterator in headers
        ? (headers as Iterable<[unknown, unknown]>)
        : Object.entries(headers as Record<string, unknown>);
    for (const [k, v] of entries) add(k, v);
  }
  for (const [k, v] of Object.entries(extra)) out.push(k, v);
  return out;
}

// Waits for the credential before each request leaves; a source that fails
// fails that request (the caller's retry asks again).
function credentialInterceptor(source: CredentialSource): Dispatcher.DispatcherComposeInterceptor {
  return (dispatch) => (opts, handler) => {
    source.headers().then(
      (extra) => dispatch({ ...opts, headers: withHeaders(opts.headers, extra) }, handler),
      (e: unknown) =>
        (handler as { onResponseError?: (c: unknown, e: Error) => void }).onResponseError?.(
          null,
          e instanceof Error ? e : new Error(String(e)),
        ),
    );
    return true;
  };
}

/**
 * One API server: its URL, the keep-alive pool every call and watch shares
 * (HTTP/2 when offered) and the current bearer token. The constructor throws
 * VmseedError CONFIG_INVALID (terminal) when `server` is not an http(s) URL.
 */
export class KubeConnection {
  readonly #spec: ConnectionSpec;
  // The pool itself (what close() closes) and what requests go through
  // (the pool, or the pool behind the credential interceptor).
  readonly #pool: Agent | ProxyAgent;
  readonly #dispatcher: Dispatcher;
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
    const pool = {
      keepAliveTimeout: 30_000,
      // HTTP/2 when the server offers it (the API server does): every watch
      // and call of the agent multiplexed on one connection, as kubelet's
      // are, instead of a connection held per open watch. A connection
      // carries as many streams as the lower of this and what the server
      // allows (kube-apiserver: 250 unless --http2-max-streams-per-connection
      // says otherwise); past that a second connection opens.
      allowH2: true,
      h2Options: { maxConcurrentStreams: H2_MAX_STREAMS },
    };
    if (spec.proxyUrl && spec.caFile) throw invalid('a proxy-url with a CA file re-read is not supported');
    this.#pool = spec.proxyUrl
      ? new ProxyAgent({ ...pool, uri: spec.proxyUrl, requestTls: tls })
      : new Agent({
          ...pool,
          connect: spec.caFile ? caFileConnector(spec.caFile, tls, spec.caRereadMs ?? CA_REREAD_MS) : tls,
        });
    this.#dispatcher = spec.credentials ? this.#pool.compose(credentialInterceptor(spec.credentials)) : this.#pool;
    this.#token = spec.token;
  }

  getCurrentCluster(): { name: string; server: string; skipTLSVerify: boolean } {
    return {
      name: 'vmseed',
      server: this.#spec.server.replace(/\/+$/, ''),
      skipTLSVerify: this.#spec.skipTLSVerify ?? false,
    };
  }

  get dispatcher(): Dispatcher {
    return this.#dispatcher;
  }

  // Fetched credentials are not here: the dispatcher sets them.
  authHeaders(): Record<string, string> {
    const token = this.#currentToken();
    return { ...this.#spec.headers, ...(token ? { Authorization: `Bearer ${token}` } : {}) };
  }

  // Lets in-flight calls finish, but not a watch that never ends.
  async close(graceMs = 2000): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), graceMs)));
    const closed = await Promise.race([this.#pool.close().then(() => 'closed' as const), late]);
    clearTimeout(timer);
    if (closed === 'late') await this.#pool.destroy();
  }

  // The API server said 401: read the token file again now (it may have
  // been rotated since the last read). True when that gave a different
  // token, so the call is worth one more try.
  tokenRejected(): boolean {
    if (this.#spec.credentials) return this.#spec.credentials.rejected();
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

/**
 * `kubeconfig` when given (one path, or a `:`-separated list merged as
 * kubectl merges KUBECONFIG; `context` instead of its current context), else
 * the in-cluster service account. Throws VmseedError CONFIG_INVALID as
 * kubeconfigSpec (kubeconfig-loader.ts) and inClusterConnection do.
 */
export async function loadConnection(
  kubeconfig: string | undefined,
  options: { context?: string; env?: NodeJS.ProcessEnv } = {},
): Promise<KubeConnection> {
  if (!kubeconfig) return inClusterConnection(options.env);
  const { kubeconfigSpec } = await import('./kubeconfig-loader.ts');
  return new KubeConnection(
    await kubeconfigSpec(kubeconfig, options.context === undefined ? {} : { context: options.context }),
  );
}
