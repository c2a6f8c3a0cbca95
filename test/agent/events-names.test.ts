// Two Events for one VMI in the same millisecond (SeedReady then SeedWarning
// in one reconcile) must get different names: the API server answers a second
// POST of the same name with 409 AlreadyExists and the warning is lost.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { KubeEventRecorder } from '../../src/agent/events.ts';
import type { KubeApi, KubeResponse } from '../../src/kube/api-client.ts';
import type { VmiObject } from '../../src/api/objects.ts';

// What the API server does with Event names: create once, 409 on a repeat.
class NameCheckingApi implements KubeApi {
  readonly created = new Map<string, { reason: string; message: string }>();
  conflicts = 0;
  async request(method: string, path: string, body?: unknown): Promise<KubeResponse> {
    await new Promise((r) => setImmediate(r));
    if (method !== 'POST') return { status: 404, body: {} };
    const ev = body as { metadata: { name: string; namespace: string }; reason: string; message: string };
    const key = `${ev.metadata.namespace}/${ev.metadata.name}`;
    if (this.created.has(key)) {
      this.conflicts++;
      return { status: 409, body: { reason: 'AlreadyExists' } };
    }
    this.created.set(key, { reason: ev.reason, message: ev.message });
    return { status: 201, body: ev };
  }
}

const vmi: VmiObject = { metadata: { name: 'vm1', namespace: 'ns', uid: 'u1' }, spec: {} };

test('SeedReady and SeedWarning recorded in the same millisecond both become Events', async () => {
  const api = new NameCheckingApi();
  const fixed = new Date('2026-11-23T10:00:00.123Z');
  const rec = new KubeEventRecorder({ api, logger: pino({ level: 'silent' }), host: 'node1', now: () => fixed });
  rec.record(vmi, 'Normal', 'SeedReady', 'seed ready');
  rec.record(vmi, 'Warning', 'SeedWarning', 'USERDATA_NO_HEADER: no #cloud-config header');
  await rec.flush();
  assert.equal(api.conflicts, 0, 'a POST met 409 AlreadyExists');
  assert.deepEqual([...api.created.values()].map((e) => e.reason).sort(), ['SeedReady', 'SeedWarning']);
});

test('many Events in one millisecond for one VMI all get distinct names of client-go form <name>.<hex>', async () => {
  const api = new NameCheckingApi();
  const fixed = new Date('2026-11-23T10:00:00.123Z');
  const rec = new KubeEventRecorder({ api, logger: pino({ level: 'silent' }), host: 'node1', now: () => fixed });
  for (let i = 0; i < 50; i++) rec.record(vmi, 'Warning', 'SeedWarning', `warning ${i}`);
  await rec.flush();
  assert.equal(api.conflicts, 0);
  assert.equal(api.created.size, 50);
  for (const key of api.created.keys()) assert.match(key, /^ns\/vm1\.[0-9a-f]+$/);
  // The hex part is nanoseconds since the epoch, as client-go's t.UnixNano().
  const nanos = [...api.created.keys()].map((k) => BigInt('0x' + k.split('.')[1]));
  for (const n of nanos)
    assert.ok(n >= BigInt(fixed.getTime()) * 1_000_000n && n < (BigInt(fixed.getTime()) + 1n) * 1_000_000n);
});
