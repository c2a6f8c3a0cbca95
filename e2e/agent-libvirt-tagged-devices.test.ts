// ConfigDrive `devices` from a real libvirt domain through the local-mode
// agent (--libvirt virsh): a VMI whose tagged interface has no pciAddress
// waits for its domain, then its meta_data.json lists the interface with the
// PCI address and MAC libvirt reports for the interface KubeVirt would have
// named `ua-<name>`. Read back with bsdtar, not vmseed's reader.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { ensureLibvirtd, uniqueName, defineDomain, emptyDomainXml, domstate, virsh } from './support/libvirtd.ts';
import { cleanupAll, removeDomainChecked, startAgentProcess, waitUntil } from './support/agent-process.ts';

const NS = 'e2e';
const MAC = '02:00:00:5e:ed:01';

before(async () => {
  await ensureLibvirtd();
});

test(
  'a tagged interface without pciAddress: DOMAIN_NOT_FOUND while there is no domain, then devices from the live domain XML',
  { timeout: 180_000 },
  async (t) => {
    const agent = await startAgentProcess();
    const name = uniqueName('tags');
    const domain = `${NS}_${name}`;
    t.after(() =>
      cleanupAll(
        () => agent.dispose(),
        () => removeDomainChecked(domain),
      ),
    );
    const detail = async () =>
      `agent log tail:\n${agent.log().split('\n').slice(-20).join('\n')}\nstatus: ${JSON.stringify(await agent.vmi(NS, name))}`;

    await agent.put(
      'vm.json',
      JSON.stringify({
        apiVersion: 'kubevirt.io/v1',
        kind: 'VirtualMachineInstance',
        metadata: { name, namespace: NS },
        spec: {
          domain: {
            firmware: { uuid: '0d6c5e1c-8f0e-4b59-9d8e-2f7c3a1b4e55' },
            devices: {
              interfaces: [{ name: 'default', masquerade: {}, tag: 'mynic' }],
              disks: [{ name: 'cloudinit', disk: { bus: 'virtio' } }],
            },
          },
          networks: [{ name: 'default', pod: {} }],
          volumes: [{ name: 'cloudinit', cloudInitConfigDrive: { userData: '#cloud-config\n' } }],
        },
      }),
    );

    const waiting = await waitUntil(
      'the VMI waiting for its domain',
      async () => {
        const r = await agent.vmi(NS, name);
        return r?.lastError?.code === 'DOMAIN_NOT_FOUND' ? r : undefined;
      },
      30_000,
      detail,
    );
    assert.match(waiting.lastError!.message, /waiting for the domain to read tagged devices' addresses/);
    assert.equal(waiting.imagePath, undefined, 'no seed before the domain');

    // As libvirt shows a KubeVirt domain's pod interface: user alias ua-<name>.
    await defineDomain(
      emptyDomainXml({
        name: domain,
        extraDevices:
          `<interface type='user'><mac address='${MAC}'/><model type='virtio'/><alias name='ua-default'/>` +
          "<address type='pci' domain='0x0000' bus='0x00' slot='0x07' function='0x0'/></interface>",
      }),
    );
    await virsh('start', '--paused', domain);
    assert.equal(await domstate(domain), 'paused');

    const rec = await waitUntil(
      'the seed injected',
      async () => {
        const r = await agent.vmi(NS, name);
        return r?.injection && r.state !== 'error' ? r : undefined;
      },
      60_000,
      detail,
    );
    assert.equal(rec.datasource, 'configdrive');
    assert.deepEqual(
      rec.warnings.map((w) => w.code),
      [],
      'no DEVICE_METADATA_INCOMPLETE',
    );
    const { stdout } = await promisify(execFile)('bsdtar', ['-xOf', rec.imagePath!, 'openstack/latest/meta_data.json']);
    const meta = JSON.parse(stdout) as { devices?: unknown };
    assert.deepEqual(meta.devices, [{ type: 'nic', bus: 'pci', address: '0000:00:07.0', mac: MAC, tags: ['mynic'] }]);
    assert.equal(await agent.stop(), 0);
  },
);
