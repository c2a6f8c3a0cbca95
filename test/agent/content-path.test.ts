// Content-addressed image names, at the agent level. An image replaced in
// place at a stable path would leave a running QEMU on the old inode while
// the injector saw the same source path and did nothing, so a rebooted guest
// read the old seed. With content-addressed names a changed seed is a new path, the
// injector (here the RecordingInjector, which models each domain's source
// and survives agent restarts) replaces the disk, and the old file is pruned
// only after that. The same holds across restarts, where the agent's memory
// of what it injected is gone.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { VmseedError } from '../../src/errors.ts';
import { imageOf, imagesOf, RecordingInjector, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { fakeKubeAndDir } from '../support/agent-harness.ts';

const seed = (host: string) => `userData: |\n  #cloud-config\n  hostname: ${host}\n`;

const setup = fakeKubeAndDir;

test(
  'a changed seed: inject with a new path → replaced, then the old image is pruned',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await setup(t);
    const injector = new RecordingInjector();
    const h = await startAgent(fake, { stateDir: dir.path, injector });
    t.after(h.stop);

    const v = fake.applyVmi(vmi('web', { cloudInit: seed('v1') }));
    await waitFor('attached', () => injector.actions('inject', 'attached').length === 1);
    await h.agent.queue.idle();
    const v1 = imageOf(h.store, v);
    assert.equal(injector.attached.get(v.metadata.uid!), v1);

    fake.applyVmi(vmi('web', { cloudInit: seed('v2') }));
    await waitFor('replaced', () => injector.actions('inject', 'replaced').length === 1);
    await h.agent.queue.idle();
    const replaced = injector.actions('inject', 'replaced')[0];
    const v2 = imageOf(h.store, v);
    assert.notEqual(v2, v1, 'a new seed is a new path');
    assert.equal(replaced.path, v2);
    assert.equal(injector.attached.get(v.metadata.uid!), v2, 'the domain holds the new image');
    assert.deepEqual(imagesOf(h.store, v), [v2], 'v1 pruned after the replace');
    assert.equal(h.agent.status.get('default/web')?.imagePath, v2);
  },
);

test(
  'inject failing: the old image stays (the domain still uses it) until a replace succeeds',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await setup(t);
    const injector = new RecordingInjector();
    const h = await startAgent(fake, { stateDir: dir.path, injector });
    t.after(h.stop);
    const v = fake.applyVmi(vmi('web', { cloudInit: seed('v1') }));
    await waitFor('attached', () => injector.actions('inject', 'attached').length === 1);
    await h.agent.queue.idle();
    const v1 = imageOf(h.store, v);

    const realInject = injector.inject.bind(injector);
    let failures = 0;
    injector.inject = async (target, path) => {
      if (failures++ < 1)
        throw new VmseedError('VIRSH_TIMEOUT', 'virsh attach-device timed out; will retry', { kind: 'retryable' });
      return realInject(target, path);
    };
    fake.applyVmi(vmi('web', { cloudInit: seed('v2') }));
    await waitFor('a failed inject', () => failures >= 1);
    assert.ok(existsSync(v1), 'v1 kept while the domain may still name it');
    await waitFor('replaced after the retry', () => injector.actions('inject', 'replaced').length === 1, 20_000);
    await h.agent.queue.idle();
    assert.deepEqual(imagesOf(h.store, v), [injector.attached.get(v.metadata.uid!)!]);
    assert.ok(!existsSync(v1));
  },
);

test(
  'restart with the seed unchanged: no write, no attach or replace; with a changed seed: replaced, old pruned',
  { timeout: 30_000 },
  async (t) => {
    const { fake, dir } = await setup(t);
    // Shared across restarts: it is the domain, which outlives the agent.
    const injector = new RecordingInjector();
    const v = fake.applyVmi(vmi('web', { cloudInit: seed('v1') }));
    const h1 = await startAgent(fake, { stateDir: dir.path, injector });
    await waitFor('attached', () => injector.actions('inject', 'attached').length === 1);
    await h1.agent.queue.idle();
    await h1.stop();
    const v1 = imageOf(h1.store, v);
    const before = statSync(v1);

    // Same seed: same path, so nothing is written and the domain keeps its disk.
    const h2 = await startAgent(fake, { stateDir: dir.path, injector });
    await waitFor('ready after restart', () => h2.agent.status.get('default/web')?.state === 'ready');
    await h2.agent.queue.idle();
    await h2.stop();
    const after = statSync(v1);
    assert.equal(after.ino, before.ino, 'not rewritten');
    assert.equal(after.mtimeMs, before.mtimeMs, 'not rewritten');
    assert.equal(injector.actions('inject', 'attached').length, 1, 'no second attach');
    assert.equal(injector.actions('inject', 'replaced').length, 0, 'no replace');
    assert.deepEqual(imagesOf(h2.store, v), [v1]);

    // Changed while the agent was down: the new agent knows nothing of what it
    // injected, but the domain's source (v1) is not the new path.
    fake.applyVmi(vmi('web', { cloudInit: seed('v2') }));
    // A crash between write and prune left a third image behind.
    const leftover = join(
      h2.store.dirFor({ namespace: 'default', name: 'web', uid: v.metadata.uid! }),
      'nocloud-0123456789abcdef.iso',
    );
    copyFileSync(v1, leftover);
    const h3 = await startAgent(fake, { stateDir: dir.path, injector });
    t.after(h3.stop);
    await waitFor('replaced after restart', () => injector.actions('inject', 'replaced').length === 1);
    await h3.agent.queue.idle();
    const v2 = injector.actions('inject', 'replaced')[0].path!;
    assert.notEqual(v2, v1);
    assert.equal(injector.attached.get(v.metadata.uid!), v2);
    assert.deepEqual(imagesOf(h3.store, v), [v2], 'v1 and the leftover pruned once v2 is in the domain');
    assert.equal(injector.actions('inject', 'attached').length, 1);
  },
);
