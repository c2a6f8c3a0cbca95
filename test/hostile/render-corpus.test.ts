// The hostile corpus against the render path in-process: each case gets its
// stable code (and field) or a seed, every referenced object is fetched once,
// and `__proto__`/`constructor` keys come out as data.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ConfigMapObject, RefResolver, SecretObject, VmiObject } from '../../src/api/objects.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';
import { serializeMetaData } from '../../src/cloudinit/seed-files.ts';
import { VmseedError } from '../../src/errors.ts';
import { RenderPool } from '../../src/agent/render-pool.ts';
import { buildSeedImage } from '../../src/disk/seed-image.ts';
import { HOSTILE_CASES, NAMESPACE, secretObject, vmiObject, type HostileCase } from './corpus.ts';

class CountingResolver implements RefResolver {
  readonly inner: MemoryResolver;
  readonly gets: string[] = [];
  constructor(inner: MemoryResolver) {
    this.inner = inner;
  }
  getSecret(ns: string, name: string): Promise<SecretObject | undefined> {
    this.gets.push(`secret/${ns}/${name}`);
    return this.inner.getSecret(ns, name);
  }
  getConfigMap(ns: string, name: string): Promise<ConfigMapObject | undefined> {
    this.gets.push(`configmap/${ns}/${name}`);
    return this.inner.getConfigMap(ns, name);
  }
}

function setup(c: HostileCase): { vmi: VmiObject; refs: CountingResolver } {
  const vmi = vmiObject(c.id, c.annotation ?? '', c.spec ?? { domain: {} }) as VmiObject;
  vmi.metadata.uid = '6a1f3c3e-4e57-4d43-9d0c-2d6f0f2a9b10';
  const secrets = (c.secrets ?? []).map((s) => secretObject(s.name, s.data) as SecretObject);
  return { vmi, refs: new CountingResolver(new MemoryResolver({ secrets })) };
}

for (const c of HOSTILE_CASES) {
  test(`hostile render: ${c.id} (${c.what})`, async () => {
    const { vmi, refs } = setup(c);
    let outcome;
    let error: unknown;
    try {
      outcome = await renderSeed(vmi, refs, DEFAULT_RENDER_OPTIONS);
    } catch (e) {
      error = e;
    }
    if (c.expect.state === 'ready') {
      assert.equal(error, undefined, `unexpected ${(error as VmseedError)?.code}: ${(error as Error)?.message}`);
      assert.equal(outcome?.kind, 'seed');
    } else {
      assert.ok(error instanceof VmseedError, `expected ${c.expect.code}, got ${String(error)}`);
      assert.equal(error.code, c.expect.code, error.message);
      assert.equal(error.kind, 'terminal');
      if (c.expect.field) assert.equal(error.field, c.expect.field);
      else assert.ok(error.field, 'the error names a field');
    }
    // Each object once, however often it is mentioned.
    assert.equal(new Set(refs.gets).size, refs.gets.length, `fetched more than once: ${refs.gets.join(', ')}`);
  });
}

// The agent runs the heavy steps on its render pool's worker: with every
// step sent there (minBytes 0), each case gets the same answer and, for a
// seed, the same image bytes as in this thread.
const pool = new RenderPool({ minBytes: 0 });
after(() => pool.close());

async function answer(c: HostileCase, options: typeof DEFAULT_RENDER_OPTIONS): Promise<string> {
  const { vmi, refs } = setup(c);
  try {
    const out = await renderSeed(vmi, refs, options);
    return out.kind === 'seed' ? buildSeedImage(out.seed, new Date(0)).sha256 : `skip ${out.reason}`;
  } catch (e) {
    return e instanceof VmseedError ? `${e.code} ${e.kind} ${e.field} ${e.message}` : `not a VmseedError: ${String(e)}`;
  }
}

test('hostile render on the worker: every case answers as in this thread', async () => {
  const before = pool.offloaded;
  for (const c of HOSTILE_CASES) {
    assert.equal(
      await answer(c, { ...DEFAULT_RENDER_OPTIONS, offload: pool }),
      await answer(c, DEFAULT_RENDER_OPTIONS),
      c.id,
    );
  }
  assert.ok(pool.offloaded - before >= HOSTILE_CASES.length, `steps ran on the worker (${pool.offloaded - before})`);
  assert.equal(({} as Record<string, unknown>).polluted, undefined, 'Object.prototype untouched');
});

test('__proto__ and constructor stay data: in merged user-data and in meta-data', async () => {
  const byId = (id: string) => HOSTILE_CASES.find((c) => c.id === id)!;
  const ud = setup(byId('proto-userdata-merge'));
  const r1 = await renderSeed(ud.vmi, ud.refs, DEFAULT_RENDER_OPTIONS);
  // Across the worker's structured clone too.
  const r1w = await renderSeed(ud.vmi, ud.refs, { ...DEFAULT_RENDER_OPTIONS, offload: pool });
  assert.deepEqual(r1w.kind === 'seed' && r1w.seed.userData, r1.kind === 'seed' && r1.seed.userData);
  assert.equal(r1.kind, 'seed');
  const text = Buffer.from(r1.kind === 'seed' ? r1.seed.userData : []).toString('utf8');
  assert.match(text, /^__proto__:\n {2}polluted: true$/m);
  assert.match(text, /^constructor:\n {2}x: 1$/m);
  assert.match(text, /^hostname: h$/m);

  const md = setup(byId('proto-metadata'));
  const r2 = await renderSeed(md.vmi, md.refs, { ...DEFAULT_RENDER_OPTIONS, offload: pool });
  assert.equal(r2.kind, 'seed');
  if (r2.kind !== 'seed') return;
  const json = JSON.parse(Buffer.from(serializeMetaData(r2.seed)[0].bytes).toString('utf8'));
  const raw = Buffer.from(serializeMetaData(r2.seed)[0].bytes).toString('utf8');
  assert.match(raw, /"__proto__":\{"polluted":true\}/);
  assert.equal(json.constructor, 'kept');
  assert.equal(({} as Record<string, unknown>).polluted, undefined, 'Object.prototype untouched');
});

test('one Secret named by userDataFrom, files and sshKeysFrom is fetched once', async () => {
  const secret = secretObject('shared', {
    'user-data': Buffer.from('#cloud-config\nruncmd: [true]\n').toString('base64'),
    authorized_keys: Buffer.from('ssh-ed25519 AAAA k\n').toString('base64'),
  }) as SecretObject;
  const refs = new CountingResolver(new MemoryResolver({ secrets: [secret] }));
  const vmi = vmiObject(
    'shared',
    [
      'userDataFrom: {kind: secret, name: shared, key: user-data}',
      'sshKeysFrom: {kind: secret, name: shared}',
      'files:',
      ...Array.from(
        { length: 10 },
        (_, i) => `  - {from: {kind: secret, name: shared, key: authorized_keys}, path: /k${i}}`,
      ),
    ].join('\n'),
  ) as VmiObject;
  const out = await renderSeed(vmi, refs, DEFAULT_RENDER_OPTIONS);
  assert.equal(out.kind, 'seed');
  assert.deepEqual(refs.gets, [`secret/${NAMESPACE}/shared`]);
});
