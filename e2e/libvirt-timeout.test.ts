// A virsh that hangs (libvirtd stuck, a launcher socket that never answers)
// must cost one VMI a timeout, not the agent: the call is killed with its
// whole process group, and other domains are served meanwhile.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { e2eInjector } from './support/libvirt-mode.ts';
import { VmseedError } from '../src/errors.ts';
import type { InjectionTarget } from '../src/libvirt/injector-contract.ts';
import {
  ensureLibvirtd,
  uniqueName,
  destroyDomain,
  emptyDomainXml,
  defineDomain,
  domblklist,
  virsh,
} from './support/libvirtd.ts';
import { parseTemplate } from '../src/libvirt/template.ts';

const run = promisify(execFile);
let dir: string;
const domains: string[] = [];

before(async () => {
  await ensureLibvirtd();
  dir = mkdtempSync(join(tmpdir(), 'vmseed-e2e-timeout-'));
});

after(async () => {
  for (const d of domains) await destroyDomain(d);
  // Unset when before() failed: nothing was made.
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function processesMatching(pattern: string): Promise<string[]> {
  try {
    const { stdout } = await run('pgrep', ['-a', '-f', pattern]);
    return stdout
      .trim()
      .split('\n')
      .filter((l) => l !== '');
  } catch {
    return []; // pgrep exits 1 when nothing matches
  }
}

function target(name: string): InjectionTarget {
  return { namespace: 'e2e', name, uid: `uid-${name}`, datasource: 'nocloud', annotations: {} };
}

const LIMIT_MS = 20_000;

test(
  'hanging virsh: VIRSH_TIMEOUT, no process left behind, another domain served meanwhile',
  { timeout: 120_000 },
  async () => {
    // A duration no other process uses, to find leftovers by command line.
    const marker = String(900_000 + Math.floor(Math.random() * 90_000));
    const wrapper = join(dir, 'virsh-hangs-for-some');
    // The sleep is a child of the shell (no exec): killing only the shell
    // would orphan it, so this checks that the whole group is killed.
    writeFileSync(
      wrapper,
      `#!/bin/sh
for a in "$@"; do
  case "$a" in *hangs*) sleep ${marker}; exit 0 ;; esac
done
exec virsh "$@"
`,
      { mode: 0o755 },
    );

    const okName = uniqueName('served');
    const okDomain = `e2e_${okName}`;
    domains.push(okDomain);
    await defineDomain(emptyDomainXml({ name: okDomain }));
    await virsh('start', '--paused', okDomain);
    const seed = join(dir, 'seed.iso');
    writeFileSync(seed, Buffer.alloc(4096));

    // A limit far above what one attach takes on a loaded machine, so the
    // other domain is served before it whatever the load.
    const inj = e2eInjector({ virshPath: wrapper, timeoutMs: LIMIT_MS });
    let hungSettled = false;
    const started = Date.now();
    const hung = inj.inject(target(uniqueName('hangs')), seed).finally(() => {
      hungSettled = true;
    });
    const served = await inj.inject(target(okName), seed);
    assert.equal(hungSettled, false, 'the other domain was served while the hanging call was still pending');
    assert.equal(served.action, 'attached');
    assert.deepEqual(
      (await domblklist(okDomain)).map((b) => b.source),
      [seed],
    );

    await assert.rejects(hung, (e: unknown) => {
      assert.ok(e instanceof VmseedError);
      assert.equal(e.code, 'VIRSH_TIMEOUT');
      assert.equal(e.retryable, true);
      return true;
    });
    const elapsed = Date.now() - started;
    assert.ok(elapsed >= LIMIT_MS, `timed out after ${elapsed} ms, not before the ${LIMIT_MS} ms limit`);
    assert.deepEqual(await processesMatching(`sleep ${marker}`), []);
    assert.deepEqual(await processesMatching(wrapper), []);
  },
);

test('virsh missing: VIRSH_NOT_FOUND, terminal', async () => {
  const inj = e2eInjector({ virshPath: join(dir, 'no-such-virsh') });
  await assert.rejects(inj.inject(target(uniqueName('nv')), '/x.iso'), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'VIRSH_NOT_FOUND');
    assert.equal(e.retryable, false);
    return true;
  });
});

test('per-VMI URI template: the socket path is rendered from the VMI uid', async () => {
  // A socket that does not exist: virsh fails to connect, and the message
  // names the rendered path, proving which endpoint was used.
  const inj = e2eInjector({
    uriTemplate: parseTemplate('uri', `qemu+unix:///system?socket=${dir}/{uid}/libvirt-sock`),
    timeoutMs: 10_000,
  });
  const t = target(uniqueName('uri'));
  assert.equal(inj.uri(t), `qemu+unix:///system?socket=${dir}/${t.uid}/libvirt-sock`);
  await assert.rejects(inj.inject(t, '/x.iso'), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'LIBVIRT_UNREACHABLE');
    assert.equal(e.retryable, true);
    assert.match(e.message, new RegExp(`${dir}/${t.uid}/libvirt-sock`));
    return true;
  });
});
