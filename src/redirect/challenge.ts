// The challenge that tells this node's NoCloud datasource from anything else
// listening where the 169.254.169.254 redirect points. The redirect sidecar
// sends a fresh nonce; the datasource answers with an HMAC of it under a key
// derived from each of its datasource keys (the Secret both containers
// mount), one line per key so a rotation seen by one container first still
// matches. Nothing about any VMI goes in or out, and the derived key is not
// one tokens are signed with: an answer is no token.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

// Outside any datasource prefix (/v1), so it never shadows a seed path.
export const CHALLENGE_PREFIX = '/.vmseed/redirect-challenge/';
const NONCE_RE = /^[0-9a-f]{32}$/;
// A NUL: no Kubernetes UID (a token's HMAC input) can be this label.
const LABEL = 'vmseed redirect challenge\0';
/** Keys a datasource answers a challenge for; a key file holds one to a few. */
export const MAX_ANSWERS = 8;

export function newNonce(): string {
  return randomBytes(16).toString('hex');
}

/** The nonce of a challenge request target; undefined for any other target. */
export function challengeNonce(target: string): string | undefined {
  if (!target.startsWith(CHALLENGE_PREFIX)) return undefined;
  const nonce = target.slice(CHALLENGE_PREFIX.length);
  return NONCE_RE.test(nonce) ? nonce : undefined;
}

/**
 * The answer to `nonce` under one datasource key (base64url), which the redirect
 * sidecar compares with its own; never usable as a token.
 */
export function challengeAnswer(key: Uint8Array, nonce: string): string {
  const derived = createHmac('sha256', key).update(LABEL).digest();
  return createHmac('sha256', derived).update(nonce).digest('base64url');
}

// Whether any line of `body` answers `nonce` under any of `keys`.
export function answerMatches(keys: readonly Uint8Array[], nonce: string, body: string): boolean {
  const lines = body.split('\n', MAX_ANSWERS + 1).map((l) => Buffer.from(l.trim()));
  let ok = false;
  for (const k of keys) {
    const want = Buffer.from(challengeAnswer(k, nonce));
    for (const got of lines) if (got.length === want.length && timingSafeEqual(got, want)) ok = true;
  }
  return ok;
}
