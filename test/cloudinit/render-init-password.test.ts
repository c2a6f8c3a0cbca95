// init.users[].passwordFrom through renderSeed: the salt comes from the
// injected provider (or the uid-derived default), seeds are deterministic,
// and the password never reaches the seed in clear or any error message.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed, type RenderOptions } from '../../src/cloudinit/render.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { sha512Crypt } from '../../src/cloudinit/crypt-sha512.ts';
import { deriveSalt } from '../../src/cloudinit/init/password-salt.ts';
import { instanceId } from '../../src/cloudinit/kubevirt/instance-id.ts';
import { VmseedError } from '../../src/errors.ts';

const PASSWORD = 'Sup3r-secret-Passw0rd';

function vmi(uid: string, init: string): VmiObject {
  return {
    metadata: { name: 'pw', namespace: 'ns', uid, annotations: { 'vmseed.io/cloud-init': init } },
    spec: {},
  };
}
const resolver = (password = PASSWORD) =>
  new MemoryResolver({ secrets: [{ metadata: { name: 'pw', namespace: 'ns' }, stringData: { password } }] });
const INIT = 'init:\n  users: [{name: ops, passwordFrom: {name: pw}}]\n';

async function userData(
  v: VmiObject,
  options: RenderOptions = DEFAULT_RENDER_OPTIONS,
  refs = resolver(),
): Promise<string> {
  const out = await renderSeed(v, refs, options);
  assert.equal(out.kind, 'seed');
  return out.kind === 'seed' ? Buffer.from(out.seed.userData).toString('utf8') : '';
}

test('the same VMI renders the same bytes; another uid gets another salt', async () => {
  const a = await userData(vmi('uid-a', INIT));
  assert.equal(await userData(vmi('uid-a', INIT)), a);
  const b = await userData(vmi('uid-b', INIT));
  assert.notEqual(b, a);
  assert.ok(!a.includes(PASSWORD));
});

test('an injected salt provider is used, and the hash is SHA-512 crypt of the password', async () => {
  const seen: unknown[] = [];
  const options: RenderOptions = {
    ...DEFAULT_RENDER_OPTIONS,
    passwordSalt: (i) => {
      seen.push(i);
      return 'InjectedSalt0123';
    },
  };
  const ud = await userData(vmi('uid-a', INIT), options);
  assert.deepEqual(seen, [{ vmiUid: 'uid-a', user: 'ops' }]);
  assert.ok(ud.includes(`passwd: ${sha512Crypt(PASSWORD, 'InjectedSalt0123')}`), ud);
});

test('without a uid the salt is keyed by the instance-id, still stable', async () => {
  const v = vmi('', INIT);
  const ud = await userData(v);
  assert.equal(await userData(v), ud);
  // The key is the instance-id itself: the hash is the one under the salt
  // derived from it...
  const salt = deriveSalt({ vmiUid: instanceId(v), user: 'ops' });
  assert.ok(ud.includes(`passwd: ${sha512Crypt(PASSWORD, salt)}`), ud);
  // ...so a VMI with another instance-id (here its firmware UUID) gets
  // another salt, which a constant salt would not give.
  const other = vmi('', INIT);
  other.spec = { domain: { firmware: { uuid: '5d307ca9-b3ef-428c-8861-06e72d69f223' } } };
  const hashOf = (u: string) => / passwd: (\$6\$\S+)/.exec(u)?.[1];
  assert.notEqual(hashOf(await userData(other)), hashOf(ud));
  assert.notEqual(instanceId(other), instanceId(v));
});

async function errorOf(p: Promise<unknown>): Promise<VmseedError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof VmseedError);
    return e;
  }
  assert.fail('no error');
}

test('errors about passwords never quote the password', async () => {
  const bad = await errorOf(
    renderSeed(vmi('u', INIT), resolver(), { ...DEFAULT_RENDER_OPTIONS, passwordSalt: () => `${PASSWORD}$` }),
  );
  assert.equal(bad.code, 'CONFIG_INVALID');
  const empty = await errorOf(renderSeed(vmi('u', INIT), resolver('\n'), DEFAULT_RENDER_OPTIONS));
  assert.equal(empty.code, 'INIT_INVALID');
  assert.equal(empty.field, 'vmseed.io/cloud-init.init.users[0].passwordFrom');
  const wrongKey = await errorOf(
    renderSeed(
      vmi('u', 'init:\n  users: [{name: ops, passwordFrom: {name: pw, key: pass}}]\n'),
      resolver(),
      DEFAULT_RENDER_OPTIONS,
    ),
  );
  assert.equal(wrongKey.code, 'SECRET_KEY_NOT_FOUND');
  assert.equal(wrongKey.kind, 'retryable');
  for (const e of [bad, empty, wrongKey]) {
    assert.ok(!e.message.includes(PASSWORD), e.message);
    assert.ok(!JSON.stringify(e.toJSON()).includes(PASSWORD));
  }
});
