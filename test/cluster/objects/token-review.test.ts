// TokenReviewer's own rules with a scripted API: the node from the review's
// extra or the bound pod, results kept briefly under a hash of the token,
// the cache bounded, and an API server that cannot be asked never cached.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { KubeApi, KubeResponse } from '../../../src/kube/api-client.ts';
import { TokenReviewer } from '../../../src/cluster/objects/token-review.ts';

const USER = 'system:serviceaccount:vmseed:vmseed';

function scriptedApi(answer: (token: string) => KubeResponse | Error) {
  const calls: string[] = [];
  const bodies: string[] = [];
  const api: KubeApi = {
    request: (method, path, body) => {
      calls.push(`${method} ${path}`);
      bodies.push(JSON.stringify(body ?? null));
      const token = (body as { spec?: { token?: string } } | undefined)?.spec?.token ?? '';
      const a = answer(token);
      return a instanceof Error ? Promise.reject(a) : Promise.resolve(a);
    },
  };
  return { api, calls, bodies };
}

const reviewed = (node: string, audiences = ['vmseed-cluster'], username = USER): KubeResponse => ({
  status: 201,
  body: {
    status: {
      authenticated: true,
      audiences,
      user: { username, extra: { 'authentication.kubernetes.io/node-name': [node] } },
    },
  },
});

test('the node comes from the review; answers are kept briefly, by hash, bounded', async () => {
  let now = 0;
  const { api, calls } = scriptedApi((token) => reviewed(`node-${token}`));
  const r = new TokenReviewer({ api, username: USER, ttlMs: 1000, maxEntries: 2, now: () => now });
  assert.deepEqual(await r.identify('a'), { ok: true, node: 'node-a', username: USER });
  await r.identify('a');
  assert.equal(calls.length, 1, 'a second request with the same token is not reviewed again');
  now = 1001;
  await r.identify('a');
  assert.equal(calls.length, 2, 'reviewed again once the answer expired');
  await r.identify('b');
  await r.identify('c');
  assert.equal(calls.length, 4);
  await r.identify('c');
  assert.equal(calls.length, 4, 'the newest is kept');
  await r.identify('a');
  assert.equal(calls.length, 5, 'the oldest went when the cache was full');
  // Concurrent requests with one token share one review.
  const both = await Promise.all([r.identify('d'), r.identify('d')]);
  assert.deepEqual(both[0], both[1]);
  assert.equal(calls.length, 6);
});

test('refusals: audience, user, a review that cannot be made', async () => {
  const answers: Record<string, KubeResponse | Error> = {
    aud: reviewed('n', ['https://kubernetes.default.svc']),
    none: reviewed('n', []),
    user: reviewed('n', ['vmseed-cluster'], 'system:serviceaccount:tenant:default'),
    bad: { status: 201, body: { status: { authenticated: false, error: 'invalid bearer token' } } },
    down: new Error('ECONNREFUSED'),
    throttled: { status: 429, body: {} },
  };
  const { api, calls } = scriptedApi((token) => answers[token]);
  const r = new TokenReviewer({ api, username: USER });
  assert.equal((await r.identify('aud'))?.ok, false);
  assert.deepEqual(
    [await r.identify('aud'), await r.identify('none'), await r.identify('bad')].map((i) => i && !i.ok && i.status),
    [401, 401, 401],
  );
  const user = await r.identify('user');
  assert.equal(user?.ok === false && user.status, 403);
  assert.equal(await r.identify('down'), undefined);
  assert.equal(await r.identify('throttled'), undefined);
  const before = calls.length;
  await r.identify('down');
  assert.equal(calls.length, before + 1, 'a review that could not be made is not cached');
  assert.equal((await r.identify(''))?.ok, false);
});

test('before 1.30: the bound pod names the node, its UID checked', async () => {
  const { api, calls } = scriptedApi(() => ({ status: 200, body: {} }));
  const pods: Record<string, KubeResponse> = {
    '/api/v1/namespaces/vmseed/pods/p1': { status: 200, body: { metadata: { uid: 'u1' }, spec: { nodeName: 'n1' } } },
    '/api/v1/namespaces/vmseed/pods/gone': { status: 404, body: {} },
  };
  const review = (pod: string, uid: string): KubeResponse => ({
    status: 201,
    body: {
      status: {
        authenticated: true,
        audiences: ['vmseed-cluster'],
        user: {
          username: USER,
          extra: { 'authentication.kubernetes.io/pod-name': [pod], 'authentication.kubernetes.io/pod-uid': [uid] },
        },
      },
    },
  });
  const wrapped: KubeApi = {
    request: async (method, path, body, ct, signal) => {
      if (method === 'GET') {
        calls.push(`GET ${path}`);
        return pods[path] ?? { status: 404, body: {} };
      }
      const token = (body as { spec: { token: string } }).spec.token;
      await api.request(method, path, body, ct, signal);
      const [pod, uid] = token.split('/');
      return review(pod, uid);
    },
  };
  const r = new TokenReviewer({ api: wrapped, username: USER });
  assert.deepEqual(await r.identify('p1/u1'), { ok: true, node: 'n1', username: USER });
  const replaced = await r.identify('p1/u0');
  assert.equal(replaced?.ok === false && replaced.status, 401);
  const gone = await r.identify('gone/u1');
  assert.equal(gone?.ok === false && gone.status, 401);
});

test('reviews are rate-limited: tokens never seen cannot flood the API server', async () => {
  let now = 0;
  const { api, calls } = scriptedApi((token) => reviewed(token));
  const r = new TokenReviewer({ api, username: USER, reviewsPerSecond: 10, reviewBurst: 3, now: () => now });
  const answers = await Promise.all(['a', 'b', 'c', 'd'].map((x) => r.identify(x)));
  assert.deepEqual(
    answers.map((a) => a?.ok),
    [true, true, true, undefined],
  );
  assert.equal(calls.length, 3);
  assert.equal((await r.identify('a'))?.ok, true, 'a kept answer needs no review');
  now = 100;
  assert.equal((await r.identify('d'))?.ok, true, 'the budget refills');
});
