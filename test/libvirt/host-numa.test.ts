// The sysfs reader for host devices' NUMA facts, on a tree laid out as the
// kernel's (/sys/bus/pci/devices/<addr>/numa_node, /sys/bus/node/devices/
// node<N>/cpulist), and the cpulist format (Documentation/admin-guide/cputopology.rst).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseCpuList, sysfsNumaReader, withHostNuma } from '../../src/libvirt/host-numa.ts';

function tree(t: { after(fn: () => void): void }): string {
  const root = mkdtempSync(join(tmpdir(), 'vmseed-sysfs-'));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const put = (p: string, text: string) => {
    mkdirSync(join(root, p, '..'), { recursive: true });
    writeFileSync(join(root, p), text);
  };
  put('bus/pci/devices/0000:65:10.0/numa_node', '1\n');
  put('bus/pci/devices/0000:00:02.0/numa_node', '-1\n');
  put('bus/node/devices/node1/cpulist', '4-7,12\n');
  put('bus/node/devices/node2/cpulist', 'x\n');
  put('secret', '3\n');
  return root;
}

test('cpulist: ranges and singles; malformed is refused', () => {
  assert.deepEqual(parseCpuList('0-3,8,10-11'), [0, 1, 2, 3, 8, 10, 11]);
  assert.deepEqual(parseCpuList(''), []);
  assert.equal(parseCpuList('3-1'), undefined);
  assert.equal(parseCpuList('a'), undefined);
  assert.equal(parseCpuList('0-100000'), undefined);
});

test('sysfs reader: node and CPUs of a device; none for -1, unknown devices, malformed files and addresses that are not PCI addresses', async (t) => {
  const r = sysfsNumaReader(tree(t));
  assert.equal(await r.deviceNumaNode('0000:65:10.0'), 1);
  assert.equal(await r.deviceNumaNode('0000:00:02.0'), undefined);
  assert.equal(await r.deviceNumaNode('0000:66:00.0'), undefined);
  assert.equal(await r.deviceNumaNode('../../../secret'), undefined);
  assert.deepEqual(await r.nodeCpus(1), [4, 5, 6, 7, 12]);
  assert.equal(await r.nodeCpus(2), undefined);
  assert.equal(await r.nodeCpus(3), undefined);
});

test('withHostNuma fills host devices that have a host address, and leaves the rest', async (t) => {
  const r = sysfsNumaReader(tree(t));
  const out = await withHostNuma(
    [
      { kind: 'interface', alias: 'ua-default' },
      { kind: 'hostdev', alias: 'ua-hostdevice-a', hostAddress: '0000:65:10.0' },
      { kind: 'hostdev', alias: 'ua-hostdevice-b', hostAddress: '0000:00:02.0' },
      { kind: 'hostdev', alias: 'ua-hostdevice-c' },
    ],
    r,
  );
  assert.deepEqual(
    out.map((d) => d.hostNuma),
    [undefined, { node: 1, cpus: [4, 5, 6, 7, 12] }, undefined, undefined],
  );
});

test("this host's /sys: each PCI device's node is what its numa_node file says (-1: none), node 0's CPUs from its cpulist", async () => {
  const { readdirSync, readFileSync } = await import('node:fs');
  const r = sysfsNumaReader();
  const devices = readdirSync('/sys/bus/pci/devices');
  assert.ok(devices.length > 0, 'the host has PCI devices in /sys');
  for (const addr of devices) {
    const n = Number(readFileSync(`/sys/bus/pci/devices/${addr}/numa_node`, 'utf8').trim());
    assert.equal(await r.deviceNumaNode(addr), n >= 0 ? n : undefined, addr);
  }
  const cpus = await r.nodeCpus(0);
  assert.ok(cpus && cpus.length > 0, 'node 0 has CPUs');
  assert.equal(
    cpus.join(','),
    readFileSync('/sys/bus/node/devices/node0/cpulist', 'utf8')
      .trim()
      .split(',')
      .flatMap((p) => {
        const [a, b = a] = p.split('-').map(Number);
        return Array.from({ length: b - a + 1 }, (_, i) => a + i);
      })
      .join(','),
  );
});
