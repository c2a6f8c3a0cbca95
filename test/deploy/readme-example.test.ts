// The README's first annotation example is a VirtualMachine, and it is
// examples/virtualmachine.yaml byte for byte, which the agent seeds: what
// a VM owner copies from the README works as written.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { ROOT } from '../support/manifests.ts';
import { parseManifests } from '../../src/agent/local/manifests.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';

const README = readFileSync(ROOT + 'README.md', 'utf8');
const EXAMPLE = readFileSync(ROOT + 'examples/virtualmachine.yaml', 'utf8');

test("the README's first annotation example is examples/virtualmachine.yaml, a VirtualMachine", () => {
  const section = README.slice(README.indexOf('## The `vmseed.io/cloud-init` annotation'));
  const first = /```yaml\n([\s\S]*?)```/.exec(section)![1];
  assert.equal(first, EXAMPLE.slice(EXAMPLE.indexOf('apiVersion:')));
  assert.match(first, /^kind: VirtualMachine$/m);
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
