import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import {
  KUBEVIRT_FIRMWARE_UUID_NAMESPACE,
  instanceId,
  kubevirtFirmwareUuid,
  uuidV5,
} from '../../src/cloudinit/kubevirt/instance-id.ts';
import { hostname } from '../../src/cloudinit/kubevirt/hostname.ts';
import type { VmiObject } from '../../src/api/objects.ts';

const vmi = (name: string, namespace?: string, extra: Partial<VmiObject['spec']> = {}): VmiObject => ({
  metadata: { name, ...(namespace ? { namespace } : {}) },
  spec: { ...extra },
});

test('uuidV5 matches Python uuid.uuid5 (RFC 4122) for many names', () => {
  const names = ['', 'a', 'fedora-vm', 'default/testvmi', 'ünïcödé/名前', 'x'.repeat(300)];
  const ns = [KUBEVIRT_FIRMWARE_UUID_NAMESPACE, '6ba7b810-9dad-11d1-80b4-00c04fd430c8'];
  const pairs = ns.flatMap((n) => names.map((name) => [n, name]));
  const py = spawnSync(
    '/usr/bin/python3',
    [
      '-c',
      'import json,sys,uuid; print(json.dumps([str(uuid.uuid5(uuid.UUID(n), s)) for n, s in json.load(sys.stdin)]))',
    ],
    { input: JSON.stringify(pairs), encoding: 'utf8' },
  );
  assert.equal(py.status, 0, py.stderr);
  const expected = JSON.parse(py.stdout) as string[];
  assert.deepEqual(
    pairs.map(([n, s]) => uuidV5(n, s)),
    expected,
  );
});

test('instance-id is the firmware UUID when set, verbatim as KubeVirt uses it', () => {
  const v = vmi('a', 'ns', { domain: { firmware: { uuid: '5D307CA9-B3EF-428C-8861-06E72D69F223' } } });
  assert.equal(instanceId(v), '5D307CA9-B3EF-428C-8861-06E72D69F223');
});

test('instance-id without firmware is stable, and differs across namespaces', () => {
  assert.equal(instanceId(vmi('web', 'a')), instanceId(vmi('web', 'a')));
  assert.notEqual(instanceId(vmi('web', 'a')), instanceId(vmi('web', 'b')));
  assert.equal(instanceId(vmi('web')), instanceId(vmi('web', 'default')));
  assert.equal(instanceId(vmi('web', 'a')), uuidV5(KUBEVIRT_FIRMWARE_UUID_NAMESPACE, 'a/web'));
});

test("kubevirtFirmwareUuid is virt-controller's UUIDv5 of the VM name", () => {
  assert.equal(kubevirtFirmwareUuid('fedora-vm'), uuidV5('6a1a24a1-4061-4607-8bf4-a3963d0c5895', 'fedora-vm'));
});

test('hostname: spec.hostname, else the name up to the first dot, at most 63 characters', () => {
  assert.equal(hostname(vmi('db.prod', 'x', { hostname: 'custom' })), 'custom');
  assert.equal(hostname(vmi('db.prod.example')), 'db');
  assert.equal(hostname(vmi('a'.repeat(70))), 'a'.repeat(63));
});
