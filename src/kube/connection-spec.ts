// What a KubeConnection is made of, apart from the class, so that
// kubeconfig-loader.ts (which connection.ts imports) can build one without
// importing connection.ts back.
import { VmseedError } from '../errors.ts';

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
  // Sent with every request besides the token (basic auth, impersonation).
  headers?: Record<string, string>;
  // An HTTP(S) or SOCKS5 proxy every connection goes through (kubeconfig's
  // proxy-url); an https server is reached through a CONNECT tunnel.
  proxyUrl?: string;
  // Credentials that can expire (exec plugins, OIDC): asked for on every
  // request, set by the pool, so a request never leaves with a stale one.
  credentials?: CredentialSource;
}

/**
 * Credentials fetched rather than read (a kubeconfig's exec plugin or
 * auth-provider). `headers` is asked on every request and caches what it
 * can; `rejected` is told of a 401 and says whether the next `headers` will
 * bring a new credential, so the call is worth one more try.
 */
export interface CredentialSource {
  headers(): Promise<Record<string, string>>;
  rejected(): boolean;
}

/** VmseedError CONFIG_INVALID (terminal) naming `field` (default 'kubeconfig'). */
export function invalid(message: string, field = 'kubeconfig'): VmseedError {
  return new VmseedError('CONFIG_INVALID', `${field}: ${message}`, { kind: 'terminal', field });
}
