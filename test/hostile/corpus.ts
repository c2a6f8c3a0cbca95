// Hostile inputs a VM owner can put in front of the agent, as
// local-mode manifests: one VMI per case (with the Secrets it names) in
// namespace `hostile`, and what the agent must answer. Used by the unit
// test (render path), the agent-process test (local mode under the
// DaemonSet's heap cap) and bench/hostile.ts.
import type { ErrorCode } from '../../src/errors.ts';

export const NAMESPACE = 'hostile';
export const ANNOTATION = 'vmseed.io/cloud-init';

export interface HostileCase {
  id: string;
  what: string;
  // The annotation document (YAML text), or a VMI spec of its own.
  annotation?: string;
  spec?: Record<string, unknown>;
  secrets?: Array<{ name: string; data: Record<string, string> }>;
  // A terminal error with this code (and field, when given), or a seed.
  expect: { state: 'error'; code: ErrorCode; field?: string } | { state: 'ready' };
}

const MiB = 1024 * 1024;

// `levels` anchors, each a list of `width` aliases of the one before:
// width^levels copies of the leaf once expanded, from a few hundred bytes.
export function aliasBomb(levels: number, width: number, indent = ''): string {
  const lines = [`${indent}l0: &l0 "${'x'.repeat(32)}"`];
  for (let i = 1; i <= levels; i++)
    lines.push(`${indent}l${i}: &l${i} [${Array.from({ length: width }, () => `*l${i - 1}`).join(', ')}]`);
  return lines.join('\n');
}

// `#cloud-config` of `kN: N` lines up to `bytes`: the most YAML nodes per byte.
export function denseCloudConfig(bytes: number): string {
  const lines = ['#cloud-config'];
  let size = lines[0].length + 1;
  for (let i = 0; size < bytes - 32; i++) {
    const l = `k${i}: ${i}`;
    lines.push(l);
    size += l.length + 1;
  }
  return lines.join('\n') + '\n';
}

function block(text: string, indent: string): string {
  return text
    .split('\n')
    .map((l) => indent + l)
    .join('\n');
}

const b64 = (s: string | Buffer) => Buffer.from(s).toString('base64');

// One 1 MiB Secret (the API server's largest) named by every files[] entry.
const BIG_SECRET = { name: 'big', data: { blob: b64(Buffer.alloc(MiB - 64, 0x41)) } };

export const HOSTILE_CASES: readonly HostileCase[] = [
  {
    id: 'alias-bomb-metadata',
    what: 'metaData alias bomb, 8 levels x 10 aliases (705 bytes)',
    annotation: `metaData:\n${aliasBomb(8, 10, '  ')}\n`,
    expect: { state: 'error', code: 'YAML_TOO_COMPLEX', field: ANNOTATION },
  },
  {
    id: 'alias-bomb-under-alias-cap',
    what: 'metaData alias bomb within the alias cap, 6 levels x 10',
    annotation: `metaData:\n${aliasBomb(6, 10, '  ')}\n`,
    expect: { state: 'error', code: 'YAML_TOO_COMPLEX', field: ANNOTATION },
  },
  {
    id: 'alias-bomb-init',
    what: 'alias bomb under init',
    annotation: `init:\n  hostname: h\n  bomb:\n${aliasBomb(6, 10, '    ')}\n`,
    expect: { state: 'error', code: 'YAML_TOO_COMPLEX', field: ANNOTATION },
  },
  {
    id: 'alias-bomb-userdata-merge',
    what: 'alias bomb in user-data merged with init',
    annotation: `init: {hostname: h}\nuserData: |\n  #cloud-config\n${block(aliasBomb(6, 10), '  ')}\n`,
    expect: { state: 'error', code: 'YAML_TOO_COMPLEX', field: `${ANNOTATION}.userData` },
  },
  {
    id: 'alias-bomb-userdata-secret',
    what: 'alias bomb in user-data from a Secret (no merge)',
    annotation: 'secretRef: {name: bomb}\n',
    secrets: [{ name: 'bomb', data: { userdata: b64(`#cloud-config\n${aliasBomb(6, 10)}\n`) } }],
    expect: { state: 'error', code: 'YAML_TOO_COMPLEX', field: `${ANNOTATION}.secretRef` },
  },
  {
    id: 'recursive-alias',
    what: 'a recursive alias (&a [*a]) in metaData',
    annotation: 'metaData:\n  loop: &a [*a]\n',
    expect: { state: 'error', code: 'YAML_TOO_COMPLEX', field: ANNOTATION },
  },
  {
    id: 'deep-nesting',
    what: 'metaData nested 1,000 levels deep',
    annotation: `metaData:\n  deep: ${'['.repeat(1000)}${']'.repeat(1000)}\n`,
    expect: { state: 'error', code: 'YAML_TOO_COMPLEX', field: ANNOTATION },
  },
  {
    id: 'files-40x-1mib-secret',
    what: 'files[] with 40 entries naming one 1 MiB Secret',
    annotation: `files:\n${Array.from({ length: 40 }, (_, i) => `  - {from: {kind: secret, name: big, key: blob}, path: /f${i}}`).join('\n')}\n`,
    secrets: [BIG_SECRET],
    expect: { state: 'error', code: 'USERDATA_TOO_LARGE', field: `${ANNOTATION}.files[0]` },
  },
  {
    id: 'files-100x-1mib-secret',
    what: 'files[] with 100 entries naming one 1 MiB Secret',
    annotation: `files:\n${Array.from({ length: 100 }, (_, i) => `  - {from: {kind: secret, name: big, key: blob}, path: /f${i}}`).join('\n')}\n`,
    secrets: [BIG_SECRET],
    expect: { state: 'error', code: 'LIST_TOO_LONG', field: `${ANNOTATION}.files` },
  },
  {
    id: 'files-60x-100kib-secret',
    what: 'files[] with 60 entries naming one 100 KiB Secret',
    annotation: `files:\n${Array.from({ length: 60 }, (_, i) => `  - {from: {kind: secret, name: mid, key: blob}, path: /f${i}}`).join('\n')}\n`,
    secrets: [{ name: 'mid', data: { blob: b64(Buffer.alloc(100 * 1024, 0x42)) } }],
    expect: { state: 'error', code: 'USERDATA_TOO_LARGE' },
  },
  {
    id: 'base64-1mib',
    what: 'a 1 MiB base64 userdata value in a Secret (decodes to 768 KiB)',
    annotation: 'secretRef: {name: b64}\n',
    secrets: [{ name: 'b64', data: { userdata: b64(`#cloud-config\n# ${'C'.repeat(768 * 1024 - 64)}\n`) } }],
    expect: { state: 'ready' },
  },
  {
    id: 'base64-2mib',
    what: 'a 2 MiB base64 userdata value (over the 1 MiB user-data limit)',
    annotation: 'secretRef: {name: b64big}\n',
    secrets: [{ name: 'b64big', data: { userdata: b64(Buffer.alloc(1536 * 1024, 0x44)) } }],
    expect: { state: 'error', code: 'USERDATA_TOO_LARGE', field: `${ANNOTATION}.secretRef` },
  },
  {
    id: 'proto-userdata-merge',
    what: '__proto__ and constructor as user-data merge keys',
    annotation: `init: {hostname: h}\nuserData: |\n  #cloud-config\n  __proto__: {polluted: true}\n  constructor: {x: 1}\n`,
    expect: { state: 'ready' },
  },
  {
    id: 'proto-metadata',
    what: '__proto__ and constructor as metaData keys',
    annotation: 'metaData:\n  __proto__: {polluted: true}\n  constructor: kept\n',
    expect: { state: 'ready' },
  },
  {
    id: 'many-keys',
    what: 'metaData with 15,000 keys',
    annotation: `metaData:\n${Array.from({ length: 15_000 }, (_, i) => `  k${i}: ${i}`).join('\n')}\n`,
    expect: { state: 'ready' },
  },
  {
    id: 'annotation-too-large',
    what: 'an annotation of 300 KiB',
    annotation: `userData: "#cloud-config\\n# ${'y'.repeat(300 * 1024)}"\n`,
    expect: { state: 'error', code: 'ANNOTATION_TOO_LARGE', field: ANNOTATION },
  },
  {
    id: 'many-ssh-keys',
    what: '5,000 sshKeys',
    annotation: `sshKeys:\n${Array.from({ length: 5000 }, (_, i) => `  - ssh-ed25519 AAAA${i} k${i}`).join('\n')}\n`,
    expect: { state: 'error', code: 'LIST_TOO_LONG', field: `${ANNOTATION}.sshKeys` },
  },
  {
    id: 'many-init-users',
    what: '1,000 init.users',
    annotation: `init:\n  users:\n${Array.from({ length: 1000 }, (_, i) => `    - {name: u${i}}`).join('\n')}\n`,
    expect: { state: 'error', code: 'LIST_TOO_LONG', field: `${ANNOTATION}.init.users` },
  },
  {
    id: 'many-nics',
    what: '500 init.nics',
    annotation: `init:\n  nics:\n${Array.from({ length: 500 }, (_, i) => `    - {name: e${i}, dhcp4: true}`).join('\n')}\n`,
    expect: { state: 'error', code: 'LIST_TOO_LONG', field: `${ANNOTATION}.init.nics` },
  },
  {
    id: 'huge-password',
    what: 'a 1 MiB password (5,000 SHA-512 rounds over it)',
    annotation: 'init:\n  users: [{name: admin, passwordFrom: {name: pw}}]\n',
    secrets: [{ name: 'pw', data: { password: b64(Buffer.alloc(MiB - 64, 0x45)) } }],
    expect: { state: 'error', code: 'INIT_INVALID', field: `${ANNOTATION}.init.users[0].passwordFrom` },
  },
  {
    id: 'dense-userdata-1mib',
    what: 'user-data of 1 MiB of one-line keys from a Secret (the densest YAML under the limit)',
    annotation: 'secretRef: {name: dense}\n',
    secrets: [{ name: 'dense', data: { userdata: b64(denseCloudConfig(MiB - 1024)) } }],
    expect: { state: 'ready' },
  },
  {
    id: 'dense-userdata-merge-1mib',
    what: 'the same 1 MiB user-data merged with init (parsed, merged and serialised again)',
    annotation: 'init: {hostname: h}\nsecretRef: {name: dense}\n',
    secrets: [{ name: 'dense', data: { userdata: b64(denseCloudConfig(MiB - 1024)) } }],
    expect: { state: 'ready' },
  },
  {
    id: 'long-line',
    what: 'user-data of one 200 KiB line',
    annotation: `userData: "#cloud-config\\nbootcmd: [\\"echo ${'z'.repeat(200 * 1024)}\\"]\\n"\n`,
    expect: { state: 'ready' },
  },
  {
    id: 'many-interfaces-force-dhcp',
    what: 'forceDHCP on a VMI listing 20,000 interfaces',
    annotation: 'forceDHCP: true\n',
    spec: {
      domain: {
        devices: {
          interfaces: Array.from({ length: 20_000 }, (_, i) => ({
            name: `n${i}`,
            macAddress: `52:54:00:${((i >> 16) & 255).toString(16).padStart(2, '0')}:${((i >> 8) & 255).toString(16).padStart(2, '0')}:${(i & 255).toString(16).padStart(2, '0')}`,
          })),
        },
      },
    },
    expect: { state: 'error', code: 'LIST_TOO_LONG', field: 'spec.domain.devices.interfaces' },
  },
  {
    id: 'many-access-credentials',
    what: '200 accessCredentials',
    annotation: 'userData: "#cloud-config\\n"\n',
    spec: {
      domain: {},
      accessCredentials: Array.from({ length: 200 }, () => ({
        sshPublicKey: { source: { secret: { secretName: 'k' } }, propagationMethod: { noCloud: {} } },
      })),
    },
    secrets: [{ name: 'k', data: { key: b64('ssh-ed25519 AAAA k') } }],
    expect: { state: 'error', code: 'LIST_TOO_LONG', field: 'spec.accessCredentials' },
  },
];

// A VMI anyone would write, to show the others are still seeded.
export function normalVmi(name: string): object {
  return vmiObject(name, `userData: |\n  #cloud-config\n  hostname: ${name}\n`);
}

export function vmiObject(name: string, annotation: string, spec: Record<string, unknown> = { domain: {} }): object {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: { name, namespace: NAMESPACE, annotations: { [ANNOTATION]: annotation } },
    spec,
  };
}

export function secretObject(name: string, data: Record<string, string>): object {
  return { apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace: NAMESPACE }, data };
}

// The case as one local-mode manifest file (JSON documents are YAML).
export function caseManifest(c: HostileCase): string {
  const docs = [
    ...(c.secrets ?? []).map((s) => secretObject(s.name, s.data)),
    vmiObject(c.id, c.annotation ?? '', c.spec ?? { domain: {} }),
  ];
  return docs.map((d) => JSON.stringify(d)).join('\n---\n') + '\n';
}
