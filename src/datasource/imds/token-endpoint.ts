// `GET /v1/token` as KubeVirt IMDS answers it (internal/imds/handlers.go):
// `{"token","expirationTimestamp"}` with the expiry read from the JWT's
// `exp` claim, not verified (the guest presents the token to the API
// server, which does). A token that cannot be read is IMDS's 500
// `token_unavailable`. The token is read afresh for every request (the
// kubelet rotates it) and never cached, logged or counted by value.
//
// Before it is handed out, its kubernetes.io claims must name the VMI's
// namespace, its ServiceAccount and one of its current launcher pods: a
// file in the wrong pod's directory, or a pod UID that is not this VMI's,
// must not hand a guest another workload's credentials. A mismatch is
// the plain 404 and counted by reason (TOKEN_REFUSALS), never logged with
// the token.
import { goJson, imdsError, type ImdsFacts, type ImdsReply } from './identity-endpoint.ts';

/**
 * Reads the ServiceAccount token of the VMI's launcher pod on this node;
 * undefined when there is none to read. Never throws.
 */
export type ServiceAccountTokenReader = (vmi: {
  namespace: string;
  name: string;
  facts: ImdsFacts;
}) => string | undefined;

// Go's zero time.Time, which IMDS's encoder writes when the JWT has no
// usable exp (omitempty does not apply to a struct).
const ZERO_TIME = '0001-01-01T00:00:00Z';
const MIN_YEAR_MS = -62_167_219_200_000; // 0000-01-01T00:00:00Z
const MAX_YEAR_MS = 253_402_300_799_000; // 9999-12-31T23:59:59Z

// IMDS's parseJWTExpiration: three dot-separated parts, the second
// base64url without padding, a JSON object whose `exp` is a non-zero
// integer. RFC 3339 in UTC, seconds only, as Go prints time.Unix(exp, 0).
export function jwtExpiration(token: string): string | undefined {
  const parts = token.split('.');
  if (parts.length !== 3 || !/^[A-Za-z0-9_-]*$/.test(parts[1]) || parts[1].length % 4 === 1) return undefined;
  let claims: unknown;
  try {
    claims = JSON.parse(Buffer.from(parts[1], 'base64url').toString('utf8'));
  } catch {
    return undefined;
  }
  const exp = (claims as { exp?: unknown } | null)?.exp;
  if (typeof exp !== 'number' || !Number.isSafeInteger(exp) || exp === 0) return undefined;
  const ms = exp * 1000;
  // Go refuses to encode years outside 0..9999.
  if (ms < MIN_YEAR_MS || ms > MAX_YEAR_MS) return undefined;
  return new Date(ms).toISOString().replace(/\.000Z$/, 'Z');
}

const UNAVAILABLE = 'Failed to read ServiceAccount token';

/** Why /v1/token refused a token it read: the `reason` label of vmseed_imds_token_refused_total. */
export const TOKEN_REFUSALS = ['unreadable', 'namespace', 'serviceaccount', 'pod'] as const;
export type TokenRefusal = (typeof TOKEN_REFUSALS)[number];

interface KubernetesClaims {
  namespace?: unknown;
  serviceaccount?: { name?: unknown };
  pod?: { name?: unknown; uid?: unknown };
}

function kubernetesClaims(token: string): KubernetesClaims | undefined {
  const parts = token.split('.');
  if (parts.length !== 3 || !/^[A-Za-z0-9_-]*$/.test(parts[1])) return undefined;
  try {
    const claims = JSON.parse(Buffer.from(parts[1], 'base64url').toString('utf8')) as Record<string, unknown>;
    const k = claims?.['kubernetes.io'];
    return k !== null && typeof k === 'object' ? k : undefined;
  } catch {
    return undefined;
  }
}

// Why the token does not belong to this VMI's launcher pod, or undefined.
export function tokenMismatch(token: string, vmi: { namespace: string; facts: ImdsFacts }): TokenRefusal | undefined {
  const k = kubernetesClaims(token);
  if (k === undefined) return 'unreadable';
  if (k.namespace !== vmi.namespace) return 'namespace';
  if (k.serviceaccount?.name !== vmi.facts.serviceAccountName) return 'serviceaccount';
  const uid = k.pod?.uid;
  if (typeof uid !== 'string' || !vmi.facts.launcherPods.includes(uid)) return 'pod';
  const names = vmi.facts.launcherPodNames;
  if (names !== undefined && k.pod?.name !== names[uid]) return 'pod';
  return undefined;
}

// `refused`: a token was read that is not this VMI's (the caller answers 404).
export function tokenReply(
  vmi: { namespace: string; name: string; facts: ImdsFacts },
  read: ServiceAccountTokenReader | undefined,
): ImdsReply | { refused: TokenRefusal } {
  // No serviceAccount volume: KubeVirt mounts no token, and the launcher's
  // ServiceAccount (often `default`) is not the VM owner's to hand out.
  if (!vmi.facts.serviceAccountToken || read === undefined) return imdsError(500, 'token_unavailable', UNAVAILABLE);
  const raw = read(vmi);
  if (raw === undefined) return imdsError(500, 'token_unavailable', UNAVAILABLE);
  const token = raw.trim();
  const refused = tokenMismatch(token, vmi);
  if (refused !== undefined) return { refused };
  return goJson(200, { token, expirationTimestamp: jwtExpiration(token) ?? ZERO_TIME });
}
