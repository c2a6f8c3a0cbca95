// NodePodWatch: this node's pods by UID from a list and watch restricted to
// spec.nodeName, their IPs as the kubelet reports them (status.podIPs), kept
// current by the watch's events. The API and the watch are doubles of the
// interfaces the watch is given.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { NodePodWatch } from '../../src/kube/node-pods.ts';
import type { KubeApi, KubeResponse } from '../../src/kube/api-client.ts';
import type { Watcher } from '../../src/kube/list-watch.ts';
import type { WatchCallback } from '../../src/kube/watch.ts';

const UID_A = 'aaaaaaaa-0000-4000-8000-00000000000a';
const UID_B = 'bbbbbbbb-0000-4000-8000-00000000000b';

function pod(name: string, uid: string | undefined, ips: string[], rv: string, namespace = 'tenant') {
  return {
    metadata: {
      name,
      namespace,
      ...(uid ? { uid } : {}),
      resourceVersion: rv,
      ownerReferences: [{ kind: 'VirtualMachineInstance', uid: `vmi-${name}` }],
    },
    status: { podIP: ips[0], podIPs: ips.map((ip) => ({ ip })) },
  };
}

class Doubles {
  readonly lists: string[] = [];
  readonly watches: Array<{ path: string; query: Record<string, string>; callback: WatchCallback }> = [];
  readonly api: KubeApi = {
    request: (_method, path): Promise<KubeResponse> => {
      this.lists.push(path);
      return Promise.resolve({
        status: 200,
        body: {
          metadata: { resourceVersion: '10' },
          items: [
            pod('virt-launcher-a', UID_A, ['10.0.0.1', 'FD00::1'], '9'),
            pod('no-uid', undefined, ['10.0.0.9'], '8'),
          ],
        },
      });
    },
  };
  readonly watcher: Watcher = {
    watch: (path, query, callback) => {
      this.watches.push({ path, query, callback });
      return Promise.resolve({ abort: () => {} });
    },
  };
}

async function until(what: string, ok: () => boolean): Promise<void> {
  const deadline = Date.now() + 5000;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test("the node's pods by UID, their reported IPs, kept current by the watch", async () => {
  const d = new Doubles();
  const pods = new NodePodWatch({
    api: d.api,
    watcher: d.watcher,
    nodeName: 'node-a',
    logger: pino({ level: 'silent' }),
  });
  pods.start();
  try {
    await until('the watch', () => d.watches.length === 1);
    assert.deepEqual(d.lists, ['/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a']);
    assert.equal(d.watches[0].path, '/api/v1/pods');
    assert.equal(d.watches[0].query.fieldSelector, 'spec.nodeName=node-a');
    assert.deepEqual(pods.get(UID_A), {
      uid: UID_A,
      name: 'virt-launcher-a',
      namespace: 'tenant',
      owners: ['vmi-virt-launcher-a'],
      ips: ['10.0.0.1', 'fd00::1'],
    });
    let seen = pods.revision;
    d.watches[0].callback('MODIFIED', pod('virt-launcher-a', UID_A, ['10.0.0.2'], '11'));
    assert.deepEqual(pods.get(UID_A)?.ips, ['10.0.0.2']);
    assert.notEqual(pods.revision, seen);
    // A pod re-created under the same name: the old UID is gone.
    d.watches[0].callback('MODIFIED', pod('virt-launcher-a', UID_B, ['10.0.0.3'], '12'));
    assert.equal(pods.get(UID_A), undefined);
    assert.deepEqual(pods.get(UID_B)?.ips, ['10.0.0.3']);
    seen = pods.revision;
    d.watches[0].callback('DELETED', pod('virt-launcher-a', UID_B, ['10.0.0.3'], '13'));
    assert.equal(pods.get(UID_B), undefined);
    assert.notEqual(pods.revision, seen);
  } finally {
    await pods.stop();
  }
});

test('with --namespaces, one list and watch in each namespace, nothing cluster-wide', async () => {
  const d = new Doubles();
  const pods = new NodePodWatch({
    api: d.api,
    watcher: d.watcher,
    nodeName: 'node-a',
    logger: pino({ level: 'silent' }),
    namespaces: ['team-a', 'team-b'],
  });
  pods.start();
  try {
    await until('both watches', () => d.watches.length === 2);
    assert.deepEqual(d.watches.map((w) => w.path).sort(), [
      '/api/v1/namespaces/team-a/pods',
      '/api/v1/namespaces/team-b/pods',
    ]);
    assert.ok(d.lists.every((p) => p.startsWith('/api/v1/namespaces/') && p.includes('fieldSelector=')));
  } finally {
    await pods.stop();
  }
});
