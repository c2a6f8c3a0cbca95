// `vmseed build --vmi --vendor-data-from ns/name[/key]`: the agent's
// operator-wide vendor-data default, for building the same image offline.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runCli } from '../support/cli.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';

const VMI = `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: vm
  namespace: default
  uid: 11111111-2222-3333-4444-555555555555
  annotations:
    vmseed.io/cloud-init: |
      userData: |
        #cloud-config
        hostname: vm
spec: {domain: {}}
`;
const CM = `apiVersion: v1
kind: ConfigMap
metadata: {name: vendor, namespace: ops}
data:
  vendor-data: "#cloud-config\\npackages: [htop]\\n"
  other: "#cloud-config\\nruncmd: [true]\\n"
`;

test('--vendor-data-from puts the ConfigMap key into the image as vendor-data; bad values exit 2', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-build-vd-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'vmi.yaml'), VMI);
  writeFileSync(join(dir, 'cm.yaml'), CM);
  const vendorOf = (iso: string) => {
    const img = readIso(readFileSync(join(dir, iso)));
    const bytes = img.read(img.entries.find((e) => e.path.replace(/^\//, '') === 'vendor-data')?.path ?? 'missing');
    return bytes && Buffer.from(bytes).toString();
  };

  let r = await runCli(['build', '--vmi', 'vmi.yaml', '--objects', 'cm.yaml', '-o', 'plain.iso'], dir);
  assert.equal(r.code, 0, r.err);
  assert.equal(vendorOf('plain.iso'), undefined, 'no vendor-data without the flag');

  r = await runCli(
    ['build', '--vmi', 'vmi.yaml', '--objects', 'cm.yaml', '--vendor-data-from', 'ops/vendor', '-o', 'a.iso'],
    dir,
  );
  assert.equal(r.code, 0, r.err);
  assert.equal(vendorOf('a.iso'), '#cloud-config\npackages: [htop]\n');

  r = await runCli(
    ['build', '--vmi', 'vmi.yaml', '--objects', 'cm.yaml', '--vendor-data-from', 'ops/vendor/other', '-o', 'b.iso'],
    dir,
  );
  assert.equal(r.code, 0, r.err);
  assert.equal(vendorOf('b.iso'), '#cloud-config\nruncmd: [true]\n');

  r = await runCli(['build', '--vmi', 'vmi.yaml', '--vendor-data-from', 'nope', '-o', 'c.iso'], dir);
  assert.equal(r.code, 2);
  assert.match(r.err, /--vendor-data-from must be <namespace>\/<configmap>/);

  r = await runCli(['build', '--user-data', 'vmi.yaml', '--vendor-data-from', 'ops/vendor', '-o', 'd.iso'], dir);
  assert.equal(r.code, 2);
  assert.match(r.err, /--vendor-data-from goes with --vmi/);
});
