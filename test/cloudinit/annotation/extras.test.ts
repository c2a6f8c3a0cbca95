import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseExtras, permissionsText } from '../../../src/cloudinit/annotation/extras.ts';
import { parseAnnotation } from '../../../src/cloudinit/annotation/annotation.ts';

test('permissions: quoted or not, the digits as written', () => {
  assert.equal(permissionsText('0644'), '0644');
  assert.equal(permissionsText('600'), '0600');
  assert.equal(permissionsText(400), '0400');
  assert.equal(
    parseAnnotation('files: [{from: {kind: secret, name: s}, path: /x, permissions: 0440}]\n').extras.files[0]
      .permissions,
    '0440',
  );
  for (const bad of [488, '0999', 'rw-r--r--', 12, true]) assert.equal(permissionsText(bad), undefined, String(bad));
});

test("sshKeys takes a list or Virtlet's one-key-per-line text", () => {
  assert.deepEqual(parseExtras('a', { sshKeys: 'ssh-ed25519 A x\n\n# note\nssh-rsa B y\n' }).sshKeys, [
    'ssh-ed25519 A x',
    'ssh-rsa B y',
  ]);
  assert.deepEqual(parseExtras('a', { sshKeys: ['k1', ' k2 '] }).sshKeys, ['k1', 'k2']);
  assert.throws(() => parseExtras('a', { sshKeys: [1] }), { code: 'ANNOTATION_INVALID', field: 'a.sshKeys' });
});

test('object references: kind is case-insensitive, unknown keys refused', () => {
  assert.deepEqual(parseExtras('a', { sshKeysFrom: { kind: 'ConfigMap', name: 'k' } }).sshKeysFrom, {
    kind: 'configmap',
    name: 'k',
  });
  assert.throws(() => parseExtras('a', { sshKeysFrom: { kind: 'secret', name: 'k', namespace: 'other' } }), {
    field: 'a.sshKeysFrom.namespace',
  });
  assert.throws(() => parseExtras('a', { vendorDataFrom: { kind: 'secret' } }), { field: 'a.vendorDataFrom.name' });
  assert.deepEqual(
    parseExtras('a', { userDataFrom: { kind: 'secret', name: 's', key: 'k', encoding: 'base64' } }).userDataFrom,
    { kind: 'secret', name: 's', key: 'k', encoding: 'base64' },
  );
});

test('init routes need a gateway of the destination family', async () => {
  const { parseInit } = await import('../../../src/cloudinit/init/init-parse.ts');
  assert.throws(
    () =>
      parseInit(
        { nics: [{ name: 'eth0', addresses: ['192.0.2.1/24'], routes: [{ to: '10.0.0.0/8', via: '2001:db8::1' }] }] },
        'init',
      ),
    { code: 'INIT_INVALID', field: 'init.nics[0].routes[0].via' },
  );
  assert.throws(
    () =>
      parseInit(
        {
          nics: [
            { name: 'eth0', dhcp4: true },
            { name: 'eth0', dhcp6: true },
          ],
        },
        'init',
      ),
    { code: 'INIT_INVALID', field: 'init.nics[1].name' },
  );
});
