// How user-data parts combine (userdata/compose.ts), beyond the corpus cases.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { gzipSync } from 'node:zlib';
import { composeUserData } from '../../../src/cloudinit/userdata/compose.ts';

const b = (s: string) => new Uint8Array(Buffer.from(s));

test('a single part passes through byte for byte, whatever it is', () => {
  const gz = new Uint8Array(gzipSync('#cloud-config\nruncmd: [[true]]\n'));
  assert.deepEqual(composeUserData({ generated: {}, inline: { bytes: gz, field: 'u' }, mode: 'merge' })?.bytes, gz);
  const odd = b('#cloud-config\n# a comment kept\nfoo:   {a: 1}\n');
  assert.deepEqual(composeUserData({ generated: {}, inline: { bytes: odd, field: 'u' }, mode: 'merge' })?.bytes, odd);
  assert.equal(composeUserData({ generated: {}, mode: 'merge' }), undefined);
});

test('generated parts alone become #cloud-config', () => {
  const out = composeUserData({ generated: { hostname: 'h' }, mode: 'merge' })!;
  assert.equal(Buffer.from(out.bytes).toString(), '#cloud-config\nhostname: h\n');
});

test('gzip #cloud-config merges from its content, as cloud-init reads it; MIME cannot be merged', () => {
  const gz = new Uint8Array(gzipSync('#cloud-config\npackages: [z]\n'));
  const out = composeUserData({ generated: { hostname: 'h' }, inline: { bytes: gz, field: 'u' }, mode: 'merge' })!;
  assert.equal(Buffer.from(out.bytes).toString(), '#cloud-config\nhostname: h\npackages:\n  - z\n');
  const mime = b('Content-Type: multipart/mixed; boundary="x"\nMIME-Version: 1.0\n\n--x\n--x--\n');
  assert.throws(
    () => composeUserData({ generated: { hostname: 'h' }, inline: { bytes: mime, field: 'u' }, mode: 'merge' }),
    { code: 'USERDATA_MERGE_UNSUPPORTED', field: 'u' },
  );
});

test('later parts win: inline over userDataFrom over generated', () => {
  const out = composeUserData({
    generated: { hostname: 'gen', packages: ['a'] },
    from: {
      spec: { kind: 'configmap', name: 'c', encoding: 'plain' },
      entries: [{ key: 'hostname', bytes: b('from') }],
      field: 'f',
    },
    inline: { bytes: b('#cloud-config\nhostname: inline\npackages: [b]\n'), field: 'u' },
    mode: 'merge',
  })!;
  assert.equal(Buffer.from(out.bytes).toString(), '#cloud-config\nhostname: inline\npackages:\n  - a\n  - b\n');
  assert.equal(out.field, 'u');
});
