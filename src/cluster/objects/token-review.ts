// Who is asking, and from which node: the node agent's bearer token is a
// projected, pod-bound service-account token for the audience of this
// service, checked with a TokenReview under the cluster component's own
// credential. The node is the one the token is bound to: the API server
// names it in the review's extra (Kubernetes 1.30+), and before that the
// bound Pod's spec.nodeName tells it (the Pod's UID checked, so a token of
// a deleted Pod whose name was reused does not borrow the new one's node).
//
// Results are kept briefly, keyed by a hash of the token (the token itself
// is never kept or logged): an agent's every request would otherwise cost
// the API server a review.
import { createHash } from 'node:crypto';
import type { KubeApi } from '../../kube/api-client.ts';

/** The audience the agents' projected tokens are minted for. */
export const OBJECTS_AUDIENCE = 'vmseed-cluster';

const NODE_NAME_EXTRA = 'authentication.kubernetes.io/node-name';
const POD_NAME_EXTRA = 'authentication.kubernetes.io/pod-name';
const POD_UID_EXTRA = 'authentication.kubernetes.io/pod-uid';

/** Who a token is: the node its agent runs on, or why it is refused (401: not a token we accept; 403: a valid token of someone else). */
export type Identity = { ok: true; node: string; username: string } | { ok: false; status: 401 | 403; reason: string };

/** How tokens are checked and their results kept. */
export interface TokenReviewerOptions {
  // The cluster component's own API client.
  api: KubeApi;
  // `system:serviceaccount:<ns>:<name>` of the node agent.
  username: string;
  audience?: string;
  // How long an answer is kept (default 10 s; a refusal 2 s).
  ttlMs?: number;
  refusalTtlMs?: number;
  // Distinct tokens kept at once (default 4096).
  maxEntries?: number;
  // Reviews per second, on average (default 50) and in a burst (default
  // 200): anyone who reaches the listener can send tokens never seen, and
  // each costs the API server a review.
  reviewsPerSecond?: number;
  reviewBurst?: number;
  now?: () => number;
}

interface Cached {
  identity: Identity;
  expires: number;
}

interface ReviewStatus {
  authenticated?: boolean;
  audiences?: string[];
  error?: string;
  user?: { username?: string; extra?: Record<string, string[] | undefined> };
}

/**
 * Checks bearer tokens with TokenReview (see the module comment); identify()
 * never throws: an API server that cannot be asked makes a 503-worthy refusal
 * that is not cached.
 */
export class TokenReviewer {
  readonly #o: TokenReviewerOptions;
  readonly #cache = new Map<string, Cached>();
  readonly #inflight = new Map<string, Promise<Identity | undefined>>();
  #allowance: number;
  #allowanceAt: number;

  constructor(options: TokenReviewerOptions) {
    this.#o = options;
    this.#allowance = options.reviewBurst ?? 200;
    this.#allowanceAt = this.#now();
  }

  // A token bucket over reviews: past it, the request is answered 503.
  #mayReview(): boolean {
    const now = this.#now();
    const rate = this.#o.reviewsPerSecond ?? 50;
    this.#allowance = Math.min(this.#o.reviewBurst ?? 200, this.#allowance + ((now - this.#allowanceAt) / 1000) * rate);
    this.#allowanceAt = now;
    if (this.#allowance < 1) return false;
    this.#allowance -= 1;
    return true;
  }

  #now(): number {
    return this.#o.now ? this.#o.now() : Date.now();
  }

  // undefined: the API server could not be asked (the caller answers 503).
  async identify(token: string): Promise<Identity | undefined> {
    if (token === '' || token.length > 64 * 1024) return { ok: false, status: 401, reason: 'no usable bearer token' };
    const key = createHash('sha256').update(token).digest('base64url');
    const hit = this.#cache.get(key);
    if (hit && hit.expires > this.#now()) return hit.identity;
    if (hit) this.#cache.delete(key);
    let pending = this.#inflight.get(key);
    if (!pending) {
      if (!this.#mayReview()) return undefined;
      pending = this.#review(token).finally(() => this.#inflight.delete(key));
      this.#inflight.set(key, pending);
    }
    const identity = await pending;
    if (identity) this.#remember(key, identity);
    return identity;
  }

  #remember(key: string, identity: Identity): void {
    const max = this.#o.maxEntries ?? 4096;
    if (this.#cache.size >= max) {
      const now = this.#now();
      for (const [k, v] of this.#cache) if (v.expires <= now) this.#cache.delete(k);
      // Still full: the oldest goes (a Map iterates in insertion order).
      while (this.#cache.size >= max) this.#cache.delete(this.#cache.keys().next().value!);
    }
    const ttl = identity.ok ? (this.#o.ttlMs ?? 10_000) : (this.#o.refusalTtlMs ?? 2_000);
    this.#cache.set(key, { identity, expires: this.#now() + ttl });
  }

  async #review(token: string): Promise<Identity | undefined> {
    const audience = this.#o.audience ?? OBJECTS_AUDIENCE;
    let res;
    try {
      res = await this.#o.api.request('POST', '/apis/authentication.k8s.io/v1/tokenreviews', {
        apiVersion: 'authentication.k8s.io/v1',
        kind: 'TokenReview',
        spec: { token, audiences: [audience] },
      });
    } catch {
      return undefined;
    }
    if (res.status !== 200 && res.status !== 201) return undefined;
    const status: ReviewStatus = (res.body as { status?: ReviewStatus } | undefined)?.status ?? {};
    if (status.authenticated !== true) return { ok: false, status: 401, reason: 'token not authenticated' };
    // The review answers the audiences the token is valid for among those
    // asked; an API server that ignores spec.audiences answers none.
    if (!Array.isArray(status.audiences) || !status.audiences.includes(audience))
      return { ok: false, status: 401, reason: `token is not for audience ${audience}` };
    const username = status.user?.username ?? '';
    if (username !== this.#o.username)
      return { ok: false, status: 403, reason: `user "${username}" is not the node agent's service account` };
    const extra = status.user?.extra ?? {};
    const first = (k: string) => (Array.isArray(extra[k]) && typeof extra[k][0] === 'string' ? extra[k][0] : '');
    const node = first(NODE_NAME_EXTRA);
    if (node) return { ok: true, node, username };
    const podName = first(POD_NAME_EXTRA);
    const podUid = first(POD_UID_EXTRA);
    if (!podName || !podUid)
      return { ok: false, status: 403, reason: 'token is not bound to a pod: no node can be told' };
    return this.#podNode(username, podName, podUid);
  }

  // Kubernetes < 1.30: the bound Pod, in the service account's namespace.
  async #podNode(username: string, podName: string, podUid: string): Promise<Identity | undefined> {
    const namespace = username.split(':')[2] ?? '';
    const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(podName)}`;
    let res;
    try {
      res = await this.#o.api.request('GET', path);
    } catch {
      return undefined;
    }
    if (res.status === 404) return { ok: false, status: 401, reason: 'the pod the token is bound to is gone' };
    if (res.status !== 200) return undefined;
    const pod = res.body as { metadata?: { uid?: string }; spec?: { nodeName?: string } };
    if (pod.metadata?.uid !== podUid)
      return { ok: false, status: 401, reason: 'the pod the token is bound to was replaced' };
    const node = pod.spec?.nodeName ?? '';
    if (!node) return { ok: false, status: 403, reason: 'the pod the token is bound to is not scheduled' };
    return { ok: true, node, username };
  }
}
