// The agent-to-redirect launcher file: the agent's feed (the addresses of
// its VMIs' current launcher pods, from the node's Pod objects), the writer
// (rewrites only on change, atomically), and the reader (IPv4 lines only,
// a missing file is no launcher).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { VmiObject } from '../../src/api/objects.ts';
import type { Agent } from '../../src/agent/controller.ts';
import { AgentSeedDirectory } from '../../src/datasource/directory.ts';
import type { NodePod, NodePods } from '../../src/datasource/types.ts';
import { launcherAddresses } from '../../src/commands/agent/launcher-addresses.ts';
import { LauncherFileWriter, readLauncherFile, writeLauncherFile } from '../../src/redirect/launcher-file.ts';
import { vmi } from '../support/agent-harness.ts';
import { nocloudSeed } from '../datasource/datasource-fixtures.ts';

const NODE = 'node-a';

class FakePods implements NodePods {
  readonly pods = new Map<string, NodePod>();
  revision = 0;
  get(uid: string): NodePod | undefined {
    return this.pods.get(uid);
  }
  add(pod: NodePod): void {
    this.pods.set(pod.uid, pod);
    this.revision++;
  }
}

// A VMI whose activePods name `pods` and whose guest reports `reported`.
function held(name: string, pods: string[], reported: string[]): VmiObject {
  const v = vmi(name, { namespace: 'ns' });
  v.metadata.uid = `uid-${name}`;
  v.status = {
    nodeName: NODE,
    activePods: Object.fromEntries(pods.map((p) => [p, NODE])),
    interfaces: [{ name: 'default', ipAddress: reported[0], ipAddresses: reported }],
  };
  return v;
}

test("the agent's feed: its VMIs' launcher pod addresses from the Pod objects, never what a guest reports", () => {
  const pods = new FakePods();
  const seeds = new AgentSeedDirectory({ onFetch: () => {}, nodeName: NODE, pods });
  const feed = launcherAddresses({ seeds } as unknown as Agent);
  pods.add({
    uid: 'aaaaaaaa-1111-4111-8111-000000000001',
    name: 'virt-launcher-a',
    namespace: 'ns',
    owners: ['uid-a'],
    ips: ['10.244.1.7'],
  });
  // A plain pod of the node: not a launcher of any VMI.
  pods.add({
    uid: 'cccccccc-1111-4111-8111-000000000003',
    name: 'web',
    namespace: 'ns',
    owners: [],
    ips: ['10.244.1.30'],
  });
  // a's guest claims a second address, the plain pod's.
  seeds.put(
    'ns/a',
    held('a', ['aaaaaaaa-1111-4111-8111-000000000001'], ['10.244.1.7', '10.244.1.30']),
    nocloudSeed('a'),
  );
  // b's launcher pod is not known yet: nothing of b's report counts.
  seeds.put('ns/b', held('b', ['bbbbbbbb-1111-4111-8111-000000000002'], ['10.244.1.9']), nocloudSeed('b'));
  assert.deepEqual([...feed()].sort(), ['10.244.1.7']);
  pods.add({
    uid: 'bbbbbbbb-1111-4111-8111-000000000002',
    name: 'virt-launcher-b',
    namespace: 'ns',
    owners: ['uid-b'],
    ips: ['10.244.1.8'],
  });
  assert.deepEqual([...feed()].sort(), ['10.244.1.7', '10.244.1.8']);
  seeds.drop('ns/a');
  assert.deepEqual([...feed()], ['10.244.1.8']);
  // No node pods (local mode, plain libvirt): no launcher at all.
  const none = launcherAddresses({ seeds: new AgentSeedDirectory({ onFetch: () => {} }) } as unknown as Agent);
  assert.deepEqual([...none()], []);
});

test('the file: written atomically, only on change; read back as IPv4 lines only; missing is none', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-launcher-file-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const path = join(dir, 'launcher-addresses');
  assert.deepEqual(await readLauncherFile(path), { addresses: [], skipped: 0 });
  let addresses = ['10.0.0.2', '10.0.0.1', '10.0.0.2', 'fd00::1', 'not-an-address'];
  const errors: Error[] = [];
  const writer = new LauncherFileWriter({
    path,
    launcherAddresses: () => addresses,
    onError: (e) => errors.push(e),
    intervalMs: 60_000,
  });
  t.after(() => writer.close());
  await writer.poke();
  assert.equal(await readFile(path, 'utf8'), '10.0.0.1\n10.0.0.2\n');
  assert.deepEqual(await readdir(dir), ['launcher-addresses'], 'no temporary file left');
  // Unchanged: not rewritten (a hand edit stays until the list changes).
  await writeFile(path, '10.0.0.1\nhello\n10.0.0.3\n');
  await writer.poke();
  assert.deepEqual(await readLauncherFile(path), { addresses: ['10.0.0.1', '10.0.0.3'], skipped: 1 });
  addresses = [];
  await writer.poke();
  assert.equal(await readFile(path, 'utf8'), '');
  await writeLauncherFile(path, ['10.0.0.5']);
  assert.deepEqual((await readLauncherFile(path)).addresses, ['10.0.0.5']);
  assert.deepEqual(errors, []);
});

test('the reader: a symlink or a FIFO in its place is refused without blocking; a huge file costs only the cap', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-launcher-file-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const target = join(dir, 'elsewhere');
  await writeFile(target, '10.0.0.9\n');
  const link = join(dir, 'link');
  await symlink(target, link);
  await assert.rejects(readLauncherFile(link), { code: 'ELOOP' });
  const fifo = join(dir, 'fifo');
  execFileSync('mkfifo', [fifo]);
  await assert.rejects(readLauncherFile(fifo), { code: 'EINVAL' });
  // One address, then far more than the cap: only the cap's bytes are read.
  const big = join(dir, 'big');
  await writeFile(big, `10.0.0.1\n${'x'.repeat(8 * 1024 * 1024)}\n10.0.0.2\n`);
  assert.deepEqual(await readLauncherFile(big), { addresses: ['10.0.0.1'], skipped: 1 });
});
