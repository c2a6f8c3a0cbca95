// A manifest with a YAML error, in a running agent: the VMIs it defined keep
// their image and are shown stale with the reason, the file's error is in
// /status.json and the page's watch panel (degraded), vmseed_source_errors
// counts it; fixing the file clears all of it and applies the fix.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { renderStatusPage, statusJson } from '../../src/http/status-page.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { waitFor } from '../support/agent-harness.ts';
import { startLocalAgent, vmiManifest } from '../support/local-agent.ts';

const vmi = (name: string, host: string) => vmiManifest(name, `hostname: ${host}`);
const secretVmi = `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: c
  namespace: other
  annotations:
    vmseed.io/cloud-init: |
      secretRef: {name: c-ud}
spec: {domain: {}}
`;
const secret = (host: string) => `apiVersion: v1
kind: Secret
metadata: {name: c-ud, namespace: other}
stringData:
  userdata: |
    #cloud-config
    hostname: ${host}
`;

async function put(path: string, text: string): Promise<void> {
  await writeFile(`${path}.partial`, text);
  await rename(`${path}.partial`, path);
}

test(
  'a broken manifest marks its VMIs stale, degrades the watch and counts in vmseed_source_errors',
  { timeout: 60_000 },
  async (t) => {
    const metrics = createMetrics({ version: 'test', processMetrics: false });
    const { agent, manifests } = await startLocalAgent(t, {
      settleMs: 25,
      metrics,
      files: {
        'a.yaml': vmi('a', 'first'),
        'b.yaml': vmi('b', 'bee'),
        'c.yaml': secretVmi,
        'c-secret.yaml': secret('sea'),
      },
    });
    const now = new Date();
    const json = () => statusJson(agent.status.snapshot(), undefined, now);
    const vmiOf = (name: string) => json().vmis.find((v) => v.name === name);
    const gauge = async () => /^vmseed_source_errors (\d+)$/m.exec(await metrics.registry.metrics())?.[1];
    await waitFor('three ready', () => ['a', 'b', 'c'].every((n) => vmiOf(n)?.state === 'ready'), 20_000);
    assert.deepEqual(json().watch.sourceErrors, []);
    assert.equal(await gauge(), '0');
    const hashA = vmiOf('a')?.contentHash;

    // A YAML error in a.yaml, and one in the file with c's Secret.
    await put(join(manifests, 'a.yaml'), `${vmi('a', 'second')}  bad: [\n`);
    await put(join(manifests, 'c-secret.yaml'), 'kind: Secret\nmetadata: {name: c-ud\n');
    await waitFor('two files reported', () => json().watch.sourceErrors?.length === 2, 20_000);
    const errors = json().watch.sourceErrors!;
    assert.deepEqual(
      errors.map((e) => [e.file, e.code, e.vmis]),
      [
        ['a.yaml', 'MANIFEST_INVALID', ['default/a']],
        ['c-secret.yaml', 'MANIFEST_INVALID', ['other/c']],
      ],
    );
    assert.match(errors[0]?.message ?? '', /^a\.yaml: YAML error at line \d+/);
    assert.equal(vmiOf('a')?.state, 'ready');
    assert.equal(vmiOf('a')?.contentHash, hashA, 'the image of the last good version stays');
    assert.equal(vmiOf('a')?.stale?.code, 'SOURCE_STALE');
    assert.match(vmiOf('a')?.stale?.message ?? '', /manifest a\.yaml does not read or parse \(MANIFEST_INVALID\)/);
    assert.match(vmiOf('c')?.stale?.message ?? '', /manifest c-secret\.yaml/);
    assert.equal(vmiOf('b')?.stale, undefined);
    assert.equal(await gauge(), '2');
    const html = renderStatusPage(agent.status.snapshot(), { now });
    assert.match(html, /data-health="degraded"/);
    assert.match(html, /id="source-errors"/);
    assert.ok(!html.includes('sea'), 'no Secret content on the page');

    // Fixed: the fix is applied, nothing is stale, the gauge is back to 0.
    await put(join(manifests, 'a.yaml'), vmi('a', 'third'));
    await put(join(manifests, 'c-secret.yaml'), secret('sea2'));
    await waitFor('errors cleared', () => json().watch.sourceErrors?.length === 0, 20_000);
    await waitFor('a re-seeded', () => vmiOf('a')?.contentHash !== hashA && vmiOf('a')?.state === 'ready', 20_000);
    assert.equal(vmiOf('a')?.stale, undefined);
    assert.equal(vmiOf('c')?.stale, undefined);
    assert.equal(await gauge(), '0');
    assert.match(renderStatusPage(agent.status.snapshot(), { now }), /data-health="healthy"/);
  },
);
