// The first annotation example of the VM owner's guide, and the README's
// first VM, are a VirtualMachine, examples/virtualmachine.yaml byte for
// byte, which the agent seeds: what a VM owner copies from either works as
// written.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { ROOT } from '../support/manifests.ts';
import { parseManifests } from '../../src/agent/local/manifests.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';

const README = readFileSync(ROOT + 'README.md', 'utf8');
const GUIDE = readFileSync(ROOT + 'docs/vm-owners-guide.md', 'utf8');
const EXAMPLE = readFileSync(ROOT + 'examples/virtualmachine.yaml', 'utf8');

test("the guide's first annotation example and the README's first VM are examples/virtualmachine.yaml, a VirtualMachine", () => {
  for (const [doc, text, heading] of [
    ['docs/vm-owners-guide.md', GUIDE, '\n## The `vmseed.io/cloud-init` annotation\n'],
    ['README.md', README, '\n## First VM\n'],
  ] as const) {
    const at = text.indexOf(heading);
    assert.ok(at >= 0, `${doc}: ${heading.trim()}`);
    const first = /```yaml\n([\s\S]*?)```/.exec(text.slice(at))![1];
    assert.equal(first, EXAMPLE.slice(EXAMPLE.indexOf('apiVersion:')), doc);
    assert.match(first, /^kind: VirtualMachine$/m);
  }
  // The README's command applies that file.
  assert.match(README, /^kubectl apply -f examples\/virtualmachine\.yaml$/m);
});

test('the example VirtualMachine renders a seed with what its annotation asks for', async () => {
  const { vmis } = parseManifests(EXAMPLE, 'virtualmachine.yaml');
  assert.equal(vmis.length, 1);
  const outcome = await renderSeed(vmis[0], new MemoryResolver(), {
    ...DEFAULT_RENDER_OPTIONS,
    kubevirtVolumes: 'own',
  });
  assert.equal(outcome.kind, 'seed');
  if (outcome.kind !== 'seed') return;
  const userData = new TextDecoder().decode(outcome.seed.userData);
  assert.match(userData, /^#cloud-config\n/);
  assert.match(userData, /^hostname: web$/m);
  assert.match(userData, /- name: ops\n/);
  assert.match(userData, /packages:\n {2}- nginx/);
  assert.deepEqual(outcome.seed.warnings, []);
});
