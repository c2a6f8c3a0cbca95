// A Template is made by parseTemplate only, which checks the placeholders
// its kind may use; the flags' errors come from the same check.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseTemplate, renderForTarget } from '../../src/libvirt/template.ts';
import { loadConfig } from '../../src/config/config.ts';
import { VmseedError } from '../../src/errors.ts';

const T = { namespace: 'ns', name: 'vm', uid: 'u', datasource: 'nocloud' as const, annotations: {} };

test('parseTemplate: each kind takes its placeholders only, and no empty template', () => {
  assert.equal(renderForTarget(parseTemplate('domain', '{namespace}_{name}'), T), 'ns_vm');
  assert.equal(parseTemplate('image-path', '/x/{basename}'), '/x/{basename}');
  for (const [kind, text] of [
    ['uri', 'qemu:///system?socket=/x/{path}'],
    ['domain', '{basename}'],
    ['publish-dir', '/pods/{pod}'],
    ['image-path', '/x/{vm}'],
    ['domain', ' '],
  ] as const) {
    assert.throws(
      () => parseTemplate(kind, text),
      (e: unknown) => e instanceof VmseedError && e.code === 'CONFIG_INVALID' && e.field === kind,
      `${kind} ${text}`,
    );
  }
});

test('the flags parse their templates once, with the flag named in the error, and hand them on as they are', () => {
  const c = loadConfig(
    ['--local', 'd', '--platform', 'libvirt', '--domain-name', 'vm-{uid}', '--publish-dir', '/srv/{namespace}/seeds'],
    {},
    '/',
  )!;
  assert.equal(c.libvirt.domainName, 'vm-{uid}');
  assert.equal(c.libvirt.publishDir, '/srv/{namespace}/seeds');
  assert.throws(
    () => loadConfig(['--local', 'd', '--libvirt-uri', 'qemu:///system?socket={basename}'], {}, '/'),
    /--libvirt-uri: unknown placeholder \{basename\}; use \{namespace\}, \{name\}, \{uid\}, \{datasource\}, \{podUID\}/,
  );
});
