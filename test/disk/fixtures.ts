// Seeds used by the disk tests: small and 1 MiB, for both datasources.
import type { Seed } from '../../src/cloudinit/seed.ts';

const enc = new TextEncoder();

// Deterministic, compressible-but-not-trivial cloud-config of about `size` bytes.
export function bigUserData(size: number): Uint8Array {
  let s = '#cloud-config\nwrite_files:\n  - path: /etc/vmseed-big\n    content: |\n';
  let i = 0;
  while (s.length < size) s += `      line ${i++} ${((i * 2654435761) >>> 0).toString(36)}\n`;
  return enc.encode(s.slice(0, size - 1) + '\n');
}

export const TIMESTAMP = new Date('2026-03-04T05:06:07Z');

export function nocloudSeed(size: 'small' | 'large'): Seed {
  return {
    datasource: 'nocloud',
    metaData: { 'instance-id': 'iid-vmseed-1', 'local-hostname': 'vm1' },
    userData: size === 'small' ? enc.encode('#cloud-config\nhostname: vm1\n') : bigUserData(1 << 20),
    networkConfig: enc.encode('version: 2\nethernets:\n  eth0:\n    dhcp4: true\n'),
    vendorData: enc.encode('#cloud-config\nruncmd: [echo vendor]\n'),
    warnings: [],
  };
}

export function configdriveSeed(size: 'small' | 'large'): Seed {
  return {
    datasource: 'configdrive',
    metaData: {
      uuid: '5d2b1f0e-1111-4a1e-9c1e-0123456789ab',
      hostname: 'vm1',
      name: 'vm1',
      public_keys: { k: 'ssh-ed25519 AAAA test' },
    },
    userData: size === 'small' ? enc.encode('#cloud-config\nhostname: vm1\n') : bigUserData(1 << 20),
    networkConfig: enc.encode(
      JSON.stringify({
        links: [{ id: 'eth0', type: 'phy', ethernet_mac_address: '52:54:00:12:34:56' }],
        networks: [{ id: 'n0', link: 'eth0', network_id: 'n0', type: 'ipv4_dhcp' }],
        services: [],
      }),
    ),
    vendorData: enc.encode(JSON.stringify({ cloud_init: '#cloud-config\nruncmd: [echo vendor]\n' })),
    warnings: [],
  };
}
