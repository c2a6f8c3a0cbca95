import { test } from 'node:test';
import assert from 'node:assert/strict';
import { VmseedError } from '../../src/errors.ts';
import { mergeManifests, parseManifests } from '../../src/agent/local/manifests.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { kubevirtFirmwareUuid } from '../../src/cloudinit/kubevirt/instance-id.ts';

const MULTI = `# a comment before the first document
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: vm1}
spec: {}
---
apiVersion: v1
kind: Secret
metadata: {name: s1, namespace: ns1}
data: {userdata: I2Nsb3VkLWNvbmZpZwo=}
stringData: {extra: plain}
---
---
apiVersion: v1
kind: Service
metadata: {name: ssh}
---
apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: ConfigMap, metadata: {name: cm1}, data: {a: b}}
  - apiVersion: kubevirt.io/v1
    kind: VirtualMachine
    metadata: {name: vm2, namespace: ns2}
    spec:
      template:
        metadata: {annotations: {vmseed.io/cloud-init: "userData: x"}}
        spec: {domain: {devices: {}}}
`;

test('multi-document manifests become typed objects; other kinds are listed, not errors', () => {
  const m = parseManifests(MULTI, 'all.yaml');
  assert.deepEqual(
    m.vmis.map((v) => `${v.metadata.namespace}/${v.metadata.name}`),
    ['default/vm1', 'ns2/vm2'],
  );
  assert.deepEqual(
    m.secrets.map((s) => s.metadata.name),
    ['s1'],
  );
  assert.equal(m.secrets[0].stringData?.extra, 'plain');
  assert.deepEqual(
    m.configMaps.map((c) => `${c.metadata.namespace}/${c.metadata.name}`),
    ['default/cm1'],
  );
  assert.deepEqual(m.ignored, [{ kind: 'Service', name: 'ssh', document: 4 }]);
});

test("a VirtualMachine becomes the VMI virt-controller would create, with KubeVirt's firmware UUID", () => {
  const vm2 = parseManifests(MULTI, 'all.yaml').vmis[1];
  assert.equal(vm2.kind, 'VirtualMachineInstance');
  assert.equal(vm2.metadata.annotations?.['vmseed.io/cloud-init'], 'userData: x');
  assert.equal(vm2.spec.domain?.firmware?.uuid, kubevirtFirmwareUuid('vm2'));
});

function assertManifestError(text: string, pattern: RegExp): void {
  assert.throws(
    () => parseManifests(text, 'bad.yaml'),
    (e: unknown) => {
      assert.ok(e instanceof VmseedError);
      assert.equal(e.code, 'MANIFEST_INVALID');
      assert.equal(e.kind, 'terminal');
      assert.match(e.message, pattern);
      return true;
    },
  );
}

test('junk is reported with the file name and document number', () => {
  assertManifestError(
    'kind: Secret\nmetadata: {name: a}\n---\njust a string\n',
    /^bad\.yaml: document 2: is not a Kubernetes object/,
  );
  assertManifestError('metadata: {name: a}\n', /document 1: "kind" is missing/);
  assertManifestError('kind: Secret\nmetadata: {}\n', /document 1: metadata.name/);
  assertManifestError('kind: Secret\nmetadata: {name: a}\ndata: {k: "not base64!"}\n', /data\.k is not valid base64/);
  assertManifestError('kind: ConfigMap\nmetadata: {name: a}\ndata: {k: 5}\n', /data\.k must be a string/);
  assertManifestError(
    'kind: VirtualMachineInstance\nmetadata: {name: a, annotations: {x: true}}\nspec: {}\n',
    /quote values/,
  );
  assertManifestError('kind: VirtualMachine\nmetadata: {name: a}\nspec: {}\n', /spec\.template/);
  assertManifestError(
    'kind: VirtualMachineInstance\nmetadata: {name: a}\nspec: {volumes: {}}\n',
    /spec\.volumes must be a list/,
  );
  assertManifestError(
    'kind: VirtualMachineInstance\nmetadata: {name: a}\nspec: {volumes: [{name: c, cloudInitNoCloud: {userData: 5}}]}\n',
    /spec\.volumes\[0\]\.cloudInitNoCloud\.userData must be a string/,
  );
  assertManifestError(
    'kind: VirtualMachineInstance\nmetadata: {name: a}\nspec: {volumes: [{name: c, cloudInitConfigDrive: {secretRef: s}}]}\n',
    /cloudInitConfigDrive\.secretRef must be a mapping/,
  );
  assertManifestError(
    'kind: VirtualMachineInstance\nmetadata: {name: a}\nspec: {accessCredentials: [{sshPublicKey: {source: {secret: {}}}}]}\n',
    /accessCredentials\[0\]\.sshPublicKey\.source\.secret\.secretName/,
  );
});

test('YAML syntax errors say file, line and column', () => {
  assertManifestError('kind: Secret\nmetadata:\n  name: [a\n', /^bad\.yaml: YAML error at line \d+, column \d+/);
});

test('MemoryResolver finds objects by namespace and name; later ones replace earlier ones', async () => {
  const a = parseManifests('kind: Secret\nmetadata: {name: s}\nstringData: {v: one}\n', 'a.yaml');
  const b = parseManifests(
    'kind: Secret\nmetadata: {name: s}\nstringData: {v: two}\n---\nkind: ConfigMap\nmetadata: {name: c, namespace: x}\n',
    'b.yaml',
  );
  const r = new MemoryResolver(mergeManifests([a, b]));
  assert.equal((await r.getSecret('default', 's'))?.stringData?.v, 'two');
  assert.equal(await r.getSecret('other', 's'), undefined);
  assert.equal((await r.getConfigMap('x', 'c'))?.metadata.name, 'c');
  assert.equal(await r.getConfigMap('default', 'c'), undefined);
  assert.equal(r.deleteSecret('default', 's'), true);
  assert.equal(await r.getSecret('default', 's'), undefined);
});
