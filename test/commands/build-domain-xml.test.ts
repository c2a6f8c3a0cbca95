// `vmseed build --vmi --domain-xml`: with the VM's libvirt domain, ConfigDrive
// `devices` lists tagged devices at the addresses libvirt assigned, as
// KubeVirt's buildDevicesMetadata does; without it vmseed warns.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runCli } from '../support/cli.ts';
import { bsdtarExtract, tempDir } from '../disk/tools.ts';

// libvirt 9.0's dumpxml of a domain with KubeVirt-style aliases.
const DOMAIN = fileURLToPath(new URL('../fixtures/libvirt/domain-tagged-devices.xml', import.meta.url));

const VMI = `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: tagged, namespace: default}
spec:
  domain:
    firmware: {uuid: 5d307ca9-b3ef-428c-8861-06e72d69f223}
    devices:
      interfaces:
        - {name: default, tag: specialNet, masquerade: {}}
      hostDevices:
        - {name: dev1, deviceName: vendor.com/dev, tag: accel}
  networks: [{name: default, pod: {}}]
  volumes:
    - name: cloudinitdisk
      cloudInitConfigDrive: {userData: "#cloud-config\\n"}
`;

async function build(dir: string, extra: string[]) {
  const r = await runCli(['build', '--vmi', 'vmi.yaml', ...extra, '-o', 'seed.iso'], dir);
  assert.equal(r.code, 0, r.err);
  const into = join(dir, `x${extra.length}`);
  mkdirSync(into);
  const meta = JSON.parse(
    bsdtarExtract(join(dir, 'seed.iso'), into).get('openstack/latest/meta_data.json')!.toString(),
  ) as Record<string, unknown>;
  return { meta, err: r.err };
}

test("--domain-xml: devices at libvirt's addresses; without it a DEVICE_METADATA_INCOMPLETE warning", async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'vmi.yaml'), VMI);
  copyFileSync(DOMAIN, join(tmp.dir, 'domain.xml'));
  const withDomain = await build(tmp.dir, ['--domain-xml', 'domain.xml']);
  assert.deepEqual(withDomain.meta.devices, [
    { type: 'nic', bus: 'pci', address: '0000:01:00.0', mac: '02:00:00:84:e9:58', tags: ['specialNet'] },
    { type: 'hostdev', bus: 'pci', address: '0000:03:00.0', tags: ['accel'] },
  ]);
  assert.doesNotMatch(withDomain.err, /DEVICE_METADATA_INCOMPLETE/);
  const without = await build(tmp.dir, []);
  assert.equal(without.meta.devices, undefined);
  assert.match(
    without.err,
    /warning: DEVICE_METADATA_INCOMPLETE: spec\.domain\.devices\.interfaces\[0\], spec\.domain\.devices\.hostDevices\[0\]/,
  );
});

test('--domain-xml that is not a domain is a usage error', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'vmi.yaml'), VMI);
  writeFileSync(join(tmp.dir, 'bad.xml'), '<network/>');
  const r = await runCli(['build', '--vmi', 'vmi.yaml', '--domain-xml', 'bad.xml', '-o', 'x.iso'], tmp.dir);
  assert.equal(r.code, 2);
  assert.match(r.err, /--domain-xml bad\.xml: not a libvirt <domain>/);
});
