// The object service's serving certificate when no one provides one: issued
// by the cluster component itself, as KubeVirt's virt-operator issues its
// own, so the default manifests need no cert-manager. The pair is kept in a
// kubernetes.io/tls Secret so every replica serves the same certificate and
// a restart does not make the agents' trust stale; the certificate is its
// own trust anchor, published as `ca.crt` in a ConfigMap the agents mount
// (KubeVirt's `kubevirt-ca` pattern).
//
// Replicas start together: whoever's create (or resourceVersion-checked
// replace) the API server takes first wins, the others read the winner's
// pair on their 409. A renewed certificate is published next to the one it
// replaces, until that one expires: an agent whose mounted bundle is older
// than the switch still trusts whichever of the two it is shown.
//
// The Secret also holds the bundle (`ca.crt`, as cert-manager's TLS Secrets
// do), so the ConfigMap can always be rebuilt from the Secret alone: a
// replica that stopped between the two writes, or a ConfigMap edited or
// deleted, is put right by the next run.
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { isIP } from 'node:net';
import type { Logger } from 'pino';
import type { ConfigMapObject, SecretObject } from '../../api/objects.ts';
import { backoffDelay } from '../../core/backoff.ts';
import { selfSignedCert } from '../../core/self-signed-cert.ts';
import { VmseedError, asVmseedError } from '../../errors.ts';
import { statusError, statusMessage, type KubeApi, type KubeResponse } from '../../kube/api-client.ts';

const SECRET_TYPE = 'kubernetes.io/tls';
const CERT_KEY = 'tls.crt';
const KEY_KEY = 'tls.key';
const BUNDLE_KEY = 'ca.crt';
const DAY_MS = 24 * 60 * 60 * 1000;
// Rounds of read-then-write lost to another writer before giving up for
// now: two replicas settle in one, so more means something keeps writing.
const MAX_ROUNDS = 4;
// Certificates a bundle keeps: the current one and those it replaced that
// are still valid (normally one; a few more if renewals came close together).
const MAX_BUNDLE = 4;
// ERROR_CODES is a closed set; RBAC refusals share the API client's code,
// the message names the rule that is missing.
const FORBIDDEN_CODE = 'KUBE_API_FORBIDDEN';

/** Where the serving certificate is kept and what it must name. */
export interface ServingCertOptions {
  namespace: string;
  // kubernetes.io/tls Secret: tls.crt, tls.key, and ca.crt (the bundle).
  secretName: string;
  // Gets `ca.crt`, the bundle the agents trust; its other keys are left alone.
  configMapName: string;
  // subjectAltName entries, e.g. the Service's DNS names; the first is also
  // the common name. A kept certificate that does not name them all is replaced.
  dnsNames: string[];
  // Lifetime of a new certificate (default 365).
  validDays?: number;
  // Replaced once it expires within this many days (default 30).
  renewBeforeDays?: number;
  now?: () => Date;
  logger?: Logger;
  signal?: AbortSignal;
}

/** The pair to serve (PEM) and when the certificate expires. */
export interface ServingCert {
  cert: string;
  key: string;
  notAfter: Date;
}

interface Pair extends ServingCert {
  // PEM certificates, the current one first.
  bundle: string[];
}

type SecretState =
  | { exists: false }
  | { exists: true; secret: SecretObject; pair: Pair; renew?: undefined }
  | { exists: true; secret: SecretObject; pair?: Pair; renew: string };

interface Settled {
  days: number;
  renewDays: number;
  now: () => Date;
}

function settings(o: ServingCertOptions): Settled {
  const days = o.validDays ?? 365;
  const renewDays = o.renewBeforeDays ?? 30;
  if (!(days > 0)) throw new VmseedError('CONFIG_INVALID', `serving certificate validity must be positive: ${days}`);
  if (!(renewDays >= 0 && renewDays < days))
    throw new VmseedError(
      'CONFIG_INVALID',
      `serving certificate renewal (${renewDays} days before expiry) must be less than its validity (${days} days)`,
    );
  if (o.dnsNames.length === 0) throw new VmseedError('CONFIG_INVALID', 'the serving certificate needs a DNS name');
  return { days, renewDays, now: o.now ?? (() => new Date()) };
}

const secretPath = (o: ServingCertOptions, name?: string) =>
  `/api/v1/namespaces/${encodeURIComponent(o.namespace)}/secrets${name === undefined ? '' : `/${encodeURIComponent(name)}`}`;
const configMapPath = (o: ServingCertOptions, name?: string) =>
  `/api/v1/namespaces/${encodeURIComponent(o.namespace)}/configmaps${name === undefined ? '' : `/${encodeURIComponent(name)}`}`;

// A 403 names what RBAC must grant: create cannot be limited to a name
// (the name is not known when it is authorized), get and update can.
function failure(o: ServingCertOptions, method: string, path: string, res: KubeResponse): VmseedError {
  if (res.status === 403) {
    const secret = path.includes('/secrets');
    const resource = secret ? 'secrets' : 'configmaps';
    const name = secret ? o.secretName : o.configMapName;
    const said = statusMessage(res.body).slice(0, 300);
    return new VmseedError(
      FORBIDDEN_CODE,
      `the cluster component may not ${method} ${resource} in namespace "${o.namespace}" for its serving certificate` +
        `${said ? ` (${said})` : ''}: its Role needs verbs get and update on ${resource} with resourceNames ["${name}"], ` +
        `and create on ${resource}`,
      { kind: 'terminal', field: `${resource}/${name}` },
    );
  }
  if (res.status === 404 && method === 'POST')
    return new VmseedError(
      'KUBE_API_ERROR',
      `Kubernetes API answered 404 to POST ${path}: namespace "${o.namespace}" does not exist; will retry`,
      { kind: 'retryable' },
    );
  const e = statusError(method, path, res);
  // A 404 (the namespace is gone) or a 422 may be put right by whoever
  // installs: this is worth trying again, unlike a VMI's bad annotation.
  return e.retryable ? e : new VmseedError(e.code, `${e.message}; will retry`, { kind: 'retryable' });
}

function pemBlocks(text: string): string[] {
  return text.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g)?.map((b) => `${b}\n`) ?? [];
}

function notAfterOf(pem: string): Date | undefined {
  try {
    return new Date(new X509Certificate(pem).validTo);
  } catch {
    return undefined;
  }
}

const decode = (data: Record<string, string> | undefined, k: string) =>
  data?.[k] === undefined ? undefined : Buffer.from(data[k], 'base64').toString('utf8');

// The Secret's pair, and why it must be replaced, if it must. Messages name
// what is wrong, never the content.
function judge(secret: SecretObject, o: ServingCertOptions, s: Settled): SecretState {
  const cert = decode(secret.data, CERT_KEY);
  const key = decode(secret.data, KEY_KEY);
  if (!cert || !key) return { exists: true, secret, renew: `it has no ${CERT_KEY} and ${KEY_KEY}` };
  let x509: X509Certificate;
  try {
    x509 = new X509Certificate(cert);
    if (!x509.checkPrivateKey(createPrivateKey(key)))
      return { exists: true, secret, renew: `its ${KEY_KEY} is not the key of its ${CERT_KEY}` };
  } catch {
    return { exists: true, secret, renew: `its ${CERT_KEY} and ${KEY_KEY} are not a PEM certificate and key` };
  }
  const notAfter = new Date(x509.validTo);
  const bundle = [cert, ...pemBlocks(decode(secret.data, BUNDLE_KEY) ?? '')];
  const pair: Pair = { cert, key, notAfter, bundle };
  const missing = o.dnsNames.find((n) =>
    isIP(n) ? x509.checkIP(n) === undefined : x509.checkHost(n, { subject: 'never' }) === undefined,
  );
  if (missing !== undefined) return { exists: true, secret, pair, renew: `its certificate does not name ${missing}` };
  if (notAfter.getTime() - s.now().getTime() <= s.renewDays * DAY_MS)
    return { exists: true, secret, pair, renew: `its certificate expires at ${notAfter.toISOString()}` };
  return { exists: true, secret, pair };
}

// The bundle to publish: the current certificate first, then those it
// replaced that are still valid, each once.
function bundleOf(pems: string[], now: Date): string[] {
  const out: string[] = [];
  const seen = new Set<string>();
  for (const pem of pems) {
    const norm = pem.trim();
    const notAfter = notAfterOf(pem);
    if (seen.has(norm) || notAfter === undefined || (out.length > 0 && notAfter <= now)) continue;
    seen.add(norm);
    out.push(`${norm}\n`);
    if (out.length === MAX_BUNDLE) break;
  }
  return out;
}

const b64 = (s: string) => Buffer.from(s, 'utf8').toString('base64');

async function readSecret(api: KubeApi, o: ServingCertOptions, s: Settled): Promise<SecretState> {
  const path = secretPath(o, o.secretName);
  const res = await api.request('GET', path, undefined, undefined, o.signal);
  if (res.status === 404) return { exists: false };
  if (res.status !== 200) throw failure(o, 'GET', path, res);
  return judge(res.body as SecretObject, o, s);
}

async function settleSecret(api: KubeApi, o: ServingCertOptions, s: Settled): Promise<Pair> {
  for (let round = 0; round < MAX_ROUNDS; round++) {
    const state = await readSecret(api, o, s);
    if (state.exists && state.renew === undefined) return state.pair;
    if (state.exists && state.secret.type !== undefined && state.secret.type !== SECRET_TYPE)
      // The API server refuses to change a Secret's type.
      throw new VmseedError(
        'KUBE_API_ERROR',
        `Secret ${o.namespace}/${o.secretName} has type ${state.secret.type}, not ${SECRET_TYPE}, and ${state.renew}: ` +
          'delete it and a new one is issued',
        { kind: 'retryable', field: `secrets/${o.secretName}` },
      );
    const now = s.now();
    let issued: ReturnType<typeof selfSignedCert>;
    try {
      issued = selfSignedCert({ commonName: o.dnsNames[0].slice(0, 64), dnsNames: o.dnsNames, validDays: s.days, now });
    } catch (e) {
      // Only the options can be wrong here (a name that is not ASCII, say).
      throw new VmseedError('CONFIG_INVALID', `cannot issue the serving certificate: ${(e as Error).message}`, {
        cause: e,
      });
    }
    const previous = state.exists && state.pair ? state.pair.bundle : [];
    const pair: Pair = {
      cert: issued.certPem,
      key: issued.keyPem,
      notAfter: issued.notAfter,
      bundle: bundleOf([issued.certPem, ...previous], now),
    };
    const data = {
      [CERT_KEY]: b64(pair.cert),
      [KEY_KEY]: b64(pair.key),
      [BUNDLE_KEY]: b64(pair.bundle.join('')),
    };
    let res: KubeResponse;
    let method: 'POST' | 'PUT';
    let path: string;
    if (state.exists) {
      method = 'PUT';
      path = secretPath(o, o.secretName);
      // resourceVersion makes the replace conditional: of two replicas that
      // read the same expiring Secret, the second to write gets a 409 and
      // takes the first one's pair instead of replacing one already served.
      const body: SecretObject = {
        ...state.secret,
        apiVersion: 'v1',
        kind: 'Secret',
        type: SECRET_TYPE,
        data: { ...state.secret.data, ...data },
      };
      res = await api.request(method, path, body, undefined, o.signal);
    } else {
      method = 'POST';
      path = secretPath(o);
      const body: SecretObject = {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: o.secretName, namespace: o.namespace },
        type: SECRET_TYPE,
        data,
      };
      res = await api.request(method, path, body, undefined, o.signal);
    }
    if (res.status === 200 || res.status === 201) {
      o.logger?.info(
        {
          secret: `${o.namespace}/${o.secretName}`,
          notAfter: pair.notAfter.toISOString(),
          ...(state.exists ? { reason: state.renew } : {}),
        },
        state.exists ? 'object service certificate renewed' : 'object service certificate issued',
      );
      return pair;
    }
    if (res.status !== 409) throw failure(o, method, path, res);
    o.logger?.debug({ secret: `${o.namespace}/${o.secretName}` }, 'another replica wrote the certificate first');
  }
  throw new VmseedError(
    'KUBE_API_ERROR',
    `Secret ${o.namespace}/${o.secretName} changed under every attempt to settle the serving certificate; will retry`,
    { kind: 'retryable', field: `secrets/${o.secretName}` },
  );
}

async function publishBundle(api: KubeApi, o: ServingCertOptions, bundle: string): Promise<void> {
  for (let round = 0; round < MAX_ROUNDS; round++) {
    const path = configMapPath(o, o.configMapName);
    const got = await api.request('GET', path, undefined, undefined, o.signal);
    let res: KubeResponse;
    let method: 'POST' | 'PUT';
    if (got.status === 404) {
      method = 'POST';
      const body: ConfigMapObject = {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: o.configMapName, namespace: o.namespace },
        data: { [BUNDLE_KEY]: bundle },
      };
      res = await api.request(method, configMapPath(o), body, undefined, o.signal);
    } else if (got.status === 200) {
      const cm = got.body as ConfigMapObject;
      if (cm.data?.[BUNDLE_KEY] === bundle) return;
      method = 'PUT';
      const body: ConfigMapObject = {
        ...cm,
        apiVersion: 'v1',
        kind: 'ConfigMap',
        data: { ...cm.data, [BUNDLE_KEY]: bundle },
      };
      res = await api.request(method, path, body, undefined, o.signal);
    } else {
      throw failure(o, 'GET', path, got);
    }
    if (res.status === 200 || res.status === 201) {
      o.logger?.info(
        { configMap: `${o.namespace}/${o.configMapName}`, certificates: pemBlocks(bundle).length },
        'object service CA bundle published',
      );
      return;
    }
    if (res.status !== 409) throw failure(o, method, method === 'POST' ? configMapPath(o) : path, res);
  }
  throw new VmseedError(
    'KUBE_API_ERROR',
    `ConfigMap ${o.namespace}/${o.configMapName} changed under every attempt to publish the CA bundle; will retry`,
    { kind: 'retryable', field: `configmaps/${o.configMapName}` },
  );
}

/**
 * The object service's serving pair from Secret `secretName`, issued (or
 * renewed, when unusable, not naming every one of `dnsNames`, or expiring
 * within renewBeforeDays) and written there when needed, with the CA bundle
 * (`ca.crt`: the certificate, then those it replaced that are still valid)
 * published in ConfigMap `configMapName`. Safe to run from several replicas
 * at once: all end with the pair the API server took first. Throws
 * VmseedError: KUBE_API_FORBIDDEN (terminal) naming the RBAC rule missing,
 * CONFIG_INVALID for bad options, CANCELLED when `signal` aborts, else a
 * retryable one.
 */
export async function ensureServingCert(api: KubeApi, options: ServingCertOptions): Promise<ServingCert> {
  const s = settings(options);
  const pair = await settleSecret(api, options, s);
  await publishBundle(api, options, bundleOf(pair.bundle, s.now()).join(''));
  return { cert: pair.cert, key: pair.key, notAfter: pair.notAfter };
}

/** What servingCertKeeper runs and whom it tells. */
export interface ServingCertKeeperOptions extends Omit<ServingCertOptions, 'logger' | 'signal'> {
  api: KubeApi;
  logger: Logger;
  // A certificate other than the one in force: put it into service.
  onCert: (cert: string, key: string) => void;
  // Between runs (default 1 h); after a failure sooner, backing off up to it.
  intervalMs?: number;
  // The certificate in force (what ensureServingCert returned at start):
  // given, the first run waits an interval; absent, it runs at once.
  current?: string;
}

/** A running servingCertKeeper. */
export interface ServingCertKeeper {
  start(): void;
  stop(): void;
  // One run now, as the timer runs it; never rejects.
  refresh(): Promise<void>;
  // Why the last run failed, or undefined.
  problem(): string | undefined;
}

/**
 * Runs ensureServingCert every `intervalMs`, so the certificate is renewed
 * before it expires and a renewal by another replica is picked up: onCert
 * gets each certificate (and key) that differs from the one in force. A
 * failed run is logged and tried again sooner; the one in force stays.
 * Timers are unref'd.
 */
export function servingCertKeeper(options: ServingCertKeeperOptions): ServingCertKeeper {
  const { api, logger, onCert, intervalMs = 60 * 60 * 1000, current, ...ensure } = options;
  let inForce = current;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  let stopped = true;
  let failures = 0;
  let lastProblem: string | undefined;
  let abort = new AbortController();

  const schedule = (ms: number) => {
    if (stopped) return;
    clearTimeout(timer);
    timer = setTimeout(() => void refresh(), ms);
    timer.unref();
  };

  const once = async () => {
    try {
      const got = await ensureServingCert(api, { ...ensure, logger, signal: abort.signal });
      failures = 0;
      lastProblem = undefined;
      if (got.cert !== inForce) {
        try {
          onCert(got.cert, got.key);
          inForce = got.cert;
        } catch (e) {
          // Not recorded as in force: the next run hands it over again.
          logger.error(
            { error: String((e as Error)?.message ?? e).slice(0, 200) },
            'object service certificate not put into service',
          );
        }
      }
      schedule(intervalMs);
    } catch (e) {
      if (abort.signal.aborted) return;
      const err = asVmseedError(e);
      failures++;
      lastProblem = err.message;
      const wait = backoffDelay({ baseMs: Math.min(5_000, intervalMs), maxMs: intervalMs }, failures);
      logger.warn(
        { code: err.code, error: err.message, retryInMs: wait },
        'object service certificate check failed; keeping the one in force',
      );
      schedule(wait);
    }
  };

  const refresh = (): Promise<void> => {
    running ??= once().finally(() => (running = undefined));
    return running;
  };

  return {
    start() {
      if (!stopped) return;
      stopped = false;
      abort = new AbortController();
      if (inForce === undefined) void refresh();
      else schedule(intervalMs);
    },
    stop() {
      stopped = true;
      clearTimeout(timer);
      abort.abort();
    },
    refresh,
    problem: () => lastProblem,
  };
}
