// The agent in namespaced mode (--namespaces) through the KubeVirt scenario
// (informer, Secret and ConfigMap reads, Events, unpause) against a fake API
// server that grants it Roles in its namespaces only: every call it makes is
// on a namespaced path, and none is refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runKubevirtScenario } from '../support/kubevirt-scenario.ts';
import { requestAttributes } from '../support/rbac.ts';
import { namespacedRbac } from '../support/kube-authz.ts';

test(
  "namespaced mode: the scenario's API calls are all namespaced, in the listed namespace, and allowed by Roles there",
  { timeout: 60_000 },
  async () => {
    const { requests, unpaused } = await runKubevirtScenario({
      namespaces: ['team-a'],
      rbac: namespacedRbac(['team-a']),
    });
    assert.deepEqual(unpaused, ['team-a/vm1']);
    assert.ok(requests.length > 0);
    for (const r of requests) {
      const a = requestAttributes({ method: r.method, path: r.path, query: r.query });
      assert.equal(a.namespace, 'team-a', `${r.method} ${r.path}`);
      assert.notEqual(r.status, 403, `${r.method} ${r.path}`);
      assert.notEqual(r.status, 401, `${r.method} ${r.path}`);
    }
    const kinds = new Set(requests.map((r) => `${r.resource}:${r.verb}`));
    for (const k of [
      'virtualmachineinstances:list',
      'virtualmachineinstances:watch',
      'secrets:get',
      'configmaps:get',
      'events:create',
      'virtualmachineinstances:update',
    ])
      assert.ok(kinds.has(k), k);
  },
);
