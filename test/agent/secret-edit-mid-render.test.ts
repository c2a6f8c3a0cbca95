// A reconcile renders from what it reads and only afterwards makes that its
// VMI's dependencies. A Secret edited after the render read it and before
// the reconcile ends requeues the VMI: the seed just built holds the content
// from before the edit, and nothing else would bring the edit to it. Driven
// step by step with a scripted watcher: the edit arrives while the render
// is still running.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import type { SecretObject, VmiObject } from '../../src/api/objects.ts';
import type { RenderSeed } from '../../src/agent/deps.ts';
import { RefDependencies } from '../../src/agent/ref-dependencies.ts';
import type { KubeApi } from '../../src/kube/api-client.ts';
import type { Watcher } from '../../src/kube/list-watch.ts';
import { ObjectWatches } from '../../src/kube/object-watches.ts';

const secret = (rv: string): SecretObject => ({
  metadata: { name: 'ud', namespace: 'ns', resourceVersion: rv },
  stringData: { userdata: `#cloud-config\nhostname: v${rv}\n` },
});

const vmi: VmiObject = { metadata: { name: 'vm', namespace: 'ns', uid: 'u1' }, spec: {} };

// Lets promise callbacks run.
const settle = () => new Promise<void>((r) => setImmediate(r));

test('a Secret edited while the render that read it runs requeues the VMI', async (t) => {
  const api: KubeApi = { request: async () => ({ status: 200, body: secret('5') }) };
  const events: Array<(phase: string, obj: unknown) => void> = [];
  const watcher: Watcher = {
    watch: async (_path, _query, callback) => {
      events.push(callback);
      return { abort: () => {} };
    },
  };
  const cache = new ObjectWatches({ api, watcher, logger: pino({ level: 'silent' }) });
  const enqueued: string[] = [];
  const deps = new RefDependencies({ cache, enqueue: (k) => enqueued.push(k), isHere: () => true });
  t.after(() => deps.stop());

  let seen: string | undefined;
  const renderSeed: RenderSeed = async (_vmi, refs) => {
    seen = (await refs.getSecret('ns', 'ud'))?.metadata.resourceVersion;
    await settle();
    assert.equal(events.length, 1, 'watched from the read');
    // The edit, streamed while this render still builds from resourceVersion 5.
    events[0]('MODIFIED', secret('6'));
    return {} as never;
  };
  const render = deps.wrapRender(renderSeed);
  await deps.around('ns/vm', () =>
    render(vmi, { getSecret: async () => undefined, getConfigMap: async () => undefined }, {} as never),
  );

  assert.equal(seen, '5');
  assert.deepEqual(enqueued, ['ns/vm'], 'run again for the edit the render missed');
  assert.equal(deps.versionOf('ns/vm'), '1', 'a new dependency version: a parked VMI runs again too');
  assert.deepEqual(
    deps.dependencies('ns/vm').map((d) => `${d.kind} ${d.namespace}/${d.name} ${d.state}`),
    ['Secret ns/ud exists'],
  );
});
