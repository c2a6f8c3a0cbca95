// The Event recorder aggregates repeats per VMI; a VMI that ended takes its
// aggregates with it, including those of Events still waiting or in flight
// when it ended (they are sent, not kept).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { KubeEventRecorder } from '../../src/agent/events.ts';
import type { KubeApi, KubeResponse } from '../../src/kube/api-client.ts';
import type { VmiObject } from '../../src/api/objects.ts';

class CreatingApi implements KubeApi {
  posts = 0;
  async request(method: string, _path: string, body?: unknown): Promise<KubeResponse> {
    await new Promise((r) => setImmediate(r));
    if (method !== 'POST') return { status: 200, body: {} };
    this.posts++;
    return { status: 201, body };
  }
}

const vmi = (name: string): VmiObject => ({ metadata: { name, namespace: 'ns', uid: `u-${name}` }, spec: {} });

test("forget(key): the ended VMI's aggregates go, sent or not yet sent; other VMIs' stay", async () => {
  const api = new CreatingApi();
  const rec = new KubeEventRecorder({ api, logger: pino({ level: 'silent' }), host: 'node1' });
  rec.record(vmi('a'), 'Normal', 'SeedReady', 'ready');
  rec.record(vmi('b'), 'Normal', 'SeedReady', 'ready');
  await rec.flush();
  assert.deepEqual([rec.holds('ns/a'), rec.holds('ns/b')], [true, true]);
  rec.forget('ns/a');
  assert.deepEqual([rec.holds('ns/a'), rec.holds('ns/b')], [false, true]);

  // Ended while its Events were in flight or waiting: all are sent, none kept.
  for (let i = 0; i < 5; i++) rec.record(vmi('a'), 'Warning', 'SeedWarning', `warning ${i}`);
  rec.forget('ns/a');
  await rec.flush();
  assert.equal(api.posts, 7);
  assert.equal(rec.holds('ns/a'), false);
  assert.equal(rec.holds('ns/b'), true);
});
