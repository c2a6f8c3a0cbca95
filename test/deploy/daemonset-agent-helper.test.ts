// The e2e helper that starts the agent as manifests/daemonset.yaml runs it
// (e2e/support/daemonset-agent.ts): what it reads from a DaemonSet and how it
// turns the securityContext into setpriv arguments and the args into a
// command line with test overrides.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  daemonSetAgentOf,
  readDaemonSetAgent,
  setprivOptions,
  withOverrides,
} from '../../e2e/support/daemonset-agent.ts';

const DS = `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: vmseed}
spec:
  template:
    spec:
      securityContext: {runAsUser: 107, runAsGroup: 107, supplementalGroups: [0]}
      containers:
        - name: sidecar
          image: x
        - name: agent
          image: x
          args: [--platform=kubevirt, --listen=0.0.0.0:8080, --log-level=info]
          env:
            - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
            - {name: HOME, value: /tmp}
          securityContext:
            runAsUser: 108
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
          volumeMounts:
            - {name: pods, mountPath: /pods}
            - {name: key, mountPath: /etc/key, readOnly: true}
      volumes:
        - {name: pods, hostPath: {path: /var/lib/kubelet/pods, type: Directory}}
        - {name: key, secret: {secretName: k}}
`;

async function withManifest(text: string, fn: (path: string) => void | Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-ds-helper-'));
  try {
    await writeFile(join(dir, 'ds.yaml'), text);
    await fn(join(dir, 'ds.yaml'));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

test("reads the agent container: args, env, the container securityContext over the pod's, mounts with their volumes", () =>
  withManifest(DS, (path) => {
    const d = readDaemonSetAgent(path);
    assert.deepEqual(d.args, ['--platform=kubevirt', '--listen=0.0.0.0:8080', '--log-level=info']);
    assert.equal(d.runAsUser, 108, 'container wins');
    assert.equal(d.runAsGroup, 107, 'pod fills in');
    assert.deepEqual(d.supplementalGroups, [0]);
    assert.deepEqual(d.capabilities, { drop: ['ALL'], add: [] });
    assert.equal(d.allowPrivilegeEscalation, false);
    assert.equal(d.readOnlyRootFilesystem, true);
    assert.deepEqual(
      d.mounts.map((m) => [m.mountPath, m.readOnly, m.volume.hostPath?.path ?? m.volume.secret?.secretName]),
      [
        ['/pods', false, '/var/lib/kubelet/pods'],
        ['/etc/key', true, 'k'],
      ],
    );
    assert.equal(d.env.length, 2);
    assert.throws(() => daemonSetAgentOf([{ kind: 'Namespace' }]), /expected one DaemonSet, found 0/);
  }));

test('setpriv: user, group, supplementary groups, no inheritable or bounding capabilities, no_new_privs', () =>
  withManifest(DS, (path) => {
    assert.deepEqual(setprivOptions(readDaemonSetAgent(path)), [
      '--reuid=108',
      '--regid=107',
      '--groups=0',
      '--inh-caps=-all',
      '--bounding-set=-all',
      '--no-new-privs',
    ]);
  }));

test('setpriv: no supplementalGroups clears them; a container that does not drop ALL, or adds a capability, is refused', () =>
  withManifest(
    DS.replace(', supplementalGroups: [0]', '').replace(
      'capabilities: {drop: [ALL]}',
      'capabilities: {drop: [NET_RAW]}',
    ),
    (path) => {
      const d = readDaemonSetAgent(path);
      assert.deepEqual(d.supplementalGroups, []);
      assert.throws(() => setprivOptions(d), /drop ALL/);
      assert.throws(() => setprivOptions({ ...d, capabilities: { drop: ['ALL'], add: ['CHOWN'] } }), /add none/);
      assert.ok(setprivOptions({ ...d, capabilities: { drop: ['ALL'], add: [] } }).includes('--clear-groups'));
    },
  ));

test("overrides replace a flag in place of the manifest's value or are appended", () => {
  assert.deepEqual(
    withOverrides(['--platform=kubevirt', '--listen=0.0.0.0:8080', '--log-level=info'], {
      listen: '127.0.0.1:1',
      'status-listen': '127.0.0.1:2',
    }),
    ['--platform=kubevirt', '--log-level=info', '--listen=127.0.0.1:1', '--status-listen=127.0.0.1:2'],
  );
  assert.throws(() => withOverrides(['--listen', '0.0.0.0:8080'], { listen: 'x' }), /--flag=value/);
});
