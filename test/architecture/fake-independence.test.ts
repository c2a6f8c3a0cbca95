// The libvirt fakes read and write libvirt's formats with their own code:
// a fake that decoded the client's frames with the client's XDR, or the
// injector's disk XML with vmseed's parser, would agree with any bug the two
// sides share. Neither a fake nor a test-side module it imports may import
// vmseed's RPC protocol code (src/libvirt/rpc/) or its XML readers and
// writers (`import type` and import() included).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

// Every fake of test/support, and the hostile daemon built on the RPC fake.
const FAKES = readdirSync(join(ROOT, 'test/support'))
  .filter((f) => /^(fake-.*|hostile-rpc-daemon)\.ts$/.test(f))
  .map((f) => `test/support/${f}`)
  .sort();

// Paths relative to the checkout; a folder ends in '/'.
const FORBIDDEN = ['src/libvirt/rpc/', 'src/libvirt/disk-xml.ts', 'src/libvirt/xml-scan.ts'];

function importsOf(source: string): string[] {
  return ts.preProcessFile(source, true, true).importedFiles.map((f) => f.fileName);
}

// Every module `file` reaches through relative imports that stay outside
// src/ (the fakes' own helpers), with what each imports.
function closure(file: string, read: (f: string) => string): Map<string, string[]> {
  const seen = new Map<string, string[]>();
  const todo = [file];
  while (todo.length > 0) {
    const f = todo.pop()!;
    if (seen.has(f)) continue;
    const targets = importsOf(read(f))
      .filter((s) => s.startsWith('.'))
      .map((s) => normalize(join(dirname(f), s)));
    seen.set(f, targets);
    todo.push(...targets.filter((t) => !t.startsWith('src/')));
  }
  return seen;
}

function violations(file: string, read: (f: string) => string): string[] {
  return [...closure(file, read)].flatMap(([from, targets]) =>
    targets
      .filter((t) => FORBIDDEN.some((f) => (f.endsWith('/') ? t.startsWith(f) : t === f)))
      .map((t) => `${from} imports ${t}`),
  );
}

const onDisk = (f: string): string => readFileSync(join(ROOT, f), 'utf8');

test('the libvirt fakes import neither the RPC protocol code nor the XML readers they stand against', () => {
  assert.deepEqual(
    FAKES.flatMap((f) => violations(f, onDisk)),
    [],
  );
});

test('each fake reads and writes through its own codec', () => {
  const codec: Record<string, string> = {
    'test/support/fake-libvirt.ts': 'test/support/fake-device-xml.ts',
    'test/support/fake-rpc-daemon.ts': 'test/support/libvirt-wire.ts',
    'test/support/hostile-rpc-daemon.ts': 'test/support/libvirt-wire.ts',
  };
  for (const [fake, own] of Object.entries(codec)) {
    assert.ok(FAKES.includes(fake), `${fake} is checked`);
    assert.ok(closure(fake, onDisk).has(own), `${fake} imports ${own}`);
  }
});

test('the rule itself: direct, `import type`, through a helper and dynamic imports are caught', () => {
  const files: Record<string, string> = {
    'test/support/a.ts': `import { x } from './helper.ts';\nimport type { Y } from '../../src/libvirt/disk-xml.ts';`,
    'test/support/helper.ts': `export const x = await import('../../src/libvirt/rpc/xdr.ts');`,
    'test/support/b.ts': `import { VirshLibvirtClient } from '../../src/libvirt/virsh/virsh-client.ts';`,
  };
  const read = (f: string): string => files[f] ?? '';
  assert.deepEqual(violations('test/support/a.ts', read), [
    'test/support/a.ts imports src/libvirt/disk-xml.ts',
    'test/support/helper.ts imports src/libvirt/rpc/xdr.ts',
  ]);
  assert.deepEqual(violations('test/support/b.ts', read), []);
});
