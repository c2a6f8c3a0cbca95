// vmseed.io/on-secret-change: refresh keeps the instance-id when referenced
// content changes; reprovision derives it from the content as well.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { RefResolver, VmiObject } from '../../src/api/objects.ts';
import { renderSeed, DEFAULT_RENDER_OPTIONS } from '../../src/cloudinit/render.ts';
import { instanceId } from '../../src/cloudinit/kubevirt/instance-id.ts';

function vmi(policy: string | undefined, extra = '', datasource = 'nocloud'): VmiObject {
  return {
    metadata: {
      name: 'web',
      namespace: 'team',
      uid: '00000000-0000-4000-8000-000000000001',
      annotations: {
        'vmseed.io/cloud-init': `datasource: ${datasource}\nsecretRef: {name: ud}\n${extra}`,
        ...(policy !== undefined ? { 'vmseed.io/on-secret-change': policy } : {}),
      },
    },
    spec: { domain: {} },
  };
}

const refs = (userdata: string): RefResolver => ({
  getSecret: async (namespace, name) => ({
    metadata: { namespace, name },
    data: { userdata: Buffer.from(userdata).toString('base64') },
  }),
  getConfigMap: async () => undefined,
});

async function idOf(v: VmiObject, userdata: string): Promise<string> {
  const out = await renderSeed(v, refs(userdata), DEFAULT_RENDER_OPTIONS);
  assert.equal(out.kind, 'seed');
  if (out.kind !== 'seed') throw new Error('no seed');
  const md = out.seed.metaData;
  if (out.seed.datasource === 'configdrive') assert.equal(md.instance_id, md.uuid);
  return String(md['instance-id'] ?? md.uuid);
}

test('refresh (the default): an edit keeps the instance-id', async () => {
  for (const policy of [undefined, 'refresh']) {
    const v = vmi(policy);
    assert.equal(await idOf(v, '#cloud-config\nhostname: a\n'), instanceId(v));
    assert.equal(await idOf(v, '#cloud-config\nhostname: b\n'), instanceId(v));
  }
});

test('reprovision: new content, new instance-id; same content, same id', async () => {
  for (const ds of ['nocloud', 'configdrive']) {
    const v = vmi('reprovision', '', ds);
    const a = await idOf(v, '#cloud-config\nhostname: a\n');
    const b = await idOf(v, '#cloud-config\nhostname: b\n');
    assert.notEqual(a, instanceId(v));
    assert.notEqual(a, b);
    assert.equal(await idOf(v, '#cloud-config\nhostname: a\n'), a, 'deterministic (agent restarts)');
    assert.match(a, /^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  }
});

test('reprovision leaves an instance-id the user set alone', async () => {
  const v = vmi('reprovision', 'metaData: {instance-id: mine}\n');
  assert.equal(await idOf(v, '#cloud-config\nhostname: a\n'), 'mine');
  assert.equal(await idOf(v, '#cloud-config\nhostname: b\n'), 'mine');
});

test('an unknown policy is refused, naming the annotation', async () => {
  await assert.rejects(renderSeed(vmi('sometimes'), refs('#cloud-config\n'), DEFAULT_RENDER_OPTIONS), (e: Error) => {
    const err = e as Error & { code?: string; field?: string };
    return (
      err.code === 'ANNOTATION_INVALID' &&
      err.field === 'metadata.annotations.vmseed.io/on-secret-change' &&
      /refresh.*reprovision/.test(err.message)
    );
  });
});
