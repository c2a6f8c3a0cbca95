// Header detection agrees with cloud-init's own classification
// (user_data.convert_string + handlers.type_from_starts_with), run on the same
// bytes in one Python process.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { gzipSync } from 'node:zlib';
import { VmseedError } from '../../../src/errors.ts';
import { USERDATA_HEADERS, detectUserDataKind, lintUserData } from '../../../src/cloudinit/userdata/user-data-lint.ts';

const samples: Record<string, Uint8Array> = {};
const add = (name: string, data: string | Uint8Array) =>
  (samples[name] = typeof data === 'string' ? new Uint8Array(Buffer.from(data)) : data);
for (const h of USERDATA_HEADERS) add(`header ${h}`, `${h}\nfoo: bar\n`);
add('upper case', '#CLOUD-CONFIG\na: 1\n');
add('leading whitespace', '\n\n   #cloud-config\na: 1\n');
add('no header yaml', 'packages: [nginx]\n');
add('no header script', 'echo hi\n');
add('space before bang', '# !/bin/sh\necho\n');
add('cloud-config typo', '#cloud-confg\na: 1\n');
add('content-type without mime-version', 'Content-Type: multipart/mixed; boundary="X"\n\n--X--\n');
add(
  'mime',
  'Content-Type: multipart/mixed; boundary="X"\nMIME-Version: 1.0\n\n--X\nContent-Type: text/x-shellscript\n\n#!/bin/sh\necho\n--X--\n',
);
add('gzip cloud-config', new Uint8Array(gzipSync('#cloud-config\na: 1\n')));
add('gzip no header', new Uint8Array(gzipSync('a: 1\n')));
add('broken gzip', new Uint8Array([0x1f, 0x8b, 0x08, 0x00, 0x01, 0x02]));
add('binary', new Uint8Array([0xff, 0xfe, 0x00, 0x41]));
add('cloudbase-init powershell', '#ps1_sysnative\nWrite-Host hi\n');
add('cloudbase-init batch', 'rem cmd\necho hi\n');
add('bom', '\ufeff#cloud-config\na: 1\n');
add('unicode spaces', '\u2003\x1c\x85#cloud-config\na: 1\n');
add('python-only space', '\u200b#!/bin/sh\n');

const PY = `
import base64, json, sys, logging
logging.disable(logging.CRITICAL)
from cloudinit import user_data, handlers
out = {}
for name, b in json.load(sys.stdin).items():
    data = base64.b64decode(b)
    if not data:
        out[name] = "empty"; continue
    msg = user_data.convert_string(data)
    if msg.is_multipart():
        out[name] = "mime"; continue
    payload = msg.get_payload(decode=True)
    out[name] = handlers.type_from_starts_with(payload) or "unknown"
print(json.dumps(out))
`;

test("header detection matches cloud-init's classification", () => {
  const input = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, Buffer.from(v).toString('base64')]));
  const py = spawnSync('/usr/bin/python3', ['-c', PY], { input: JSON.stringify(input), encoding: 'utf8' });
  assert.equal(py.status, 0, py.stderr);
  const theirs = JSON.parse(py.stdout) as Record<string, string>;
  const TYPES: Record<string, string> = {
    '#include': 'text/x-include-url',
    '#include-once': 'text/x-include-once-url',
    '#!': 'text/x-shellscript',
    '#cloud-config': 'text/cloud-config',
    '#part-handler': 'text/part-handler',
    '#cloud-boothook': 'text/cloud-boothook',
    '#cloud-config-archive': 'text/cloud-config-archive',
    '#cloud-config-jsonp': 'text/cloud-config-jsonp',
    '## template: jinja': 'text/jinja2',
  };
  for (const [name, data] of Object.entries(samples)) {
    const ours = detectUserDataKind(data).kind;
    // cloudbase-init payloads are, for cloud-init, of no known type.
    const mapped =
      ours === 'cloudbase-init'
        ? 'unknown'
        : ours === 'mime' || ours === 'unknown' || ours === 'empty'
          ? ours
          : TYPES[ours];
    assert.equal(mapped, theirs[name], name);
  }
  // The sample set covers both outcomes, or this test proves little.
  assert.ok(Object.values(theirs).filter((t) => t === 'unknown').length >= 5);
});

test('user-data without a header gets a USERDATA_NO_HEADER warning that says what cloud-init does', () => {
  const w = lintUserData(new Uint8Array(Buffer.from('packages: [nginx]\n')), 'f');
  assert.equal(w.length, 1);
  assert.equal(w[0].code, 'USERDATA_NO_HEADER');
  assert.equal(w[0].field, 'f');
  assert.match(w[0].message, /text\/x-not-multipart/);
  assert.match(w[0].message, /#cloud-config/);
  assert.doesNotMatch(w[0].message, /nginx/);
});

test('cloudbase-init scripts (Windows) are not flagged', () => {
  for (const t of [
    '#ps1_sysnative\nWrite-Host hi\n',
    '#ps1_x86\n',
    'rem cmd\r\necho hi\r\n',
    '<powershell>\n</powershell>\n',
  ]) {
    assert.equal(detectUserDataKind(new Uint8Array(Buffer.from(t))).kind, 'cloudbase-init', t);
    assert.deepEqual(lintUserData(new Uint8Array(Buffer.from(t)), 'f'), []);
  }
});

test('empty user-data is not a warning (network-only seeds)', () => {
  assert.deepEqual(lintUserData(new Uint8Array(), 'f'), []);
});

test('#cloud-config YAML errors carry line and column and never quote the data', () => {
  const secret = 'hunter2-password';
  const data = new Uint8Array(Buffer.from(`#cloud-config\npassword: ${secret}\nusers:\n  - name: a\n   b: c\n`));
  assert.throws(
    () => lintUserData(data, 'userData'),
    (e: unknown) => {
      assert.ok(e instanceof VmseedError);
      assert.equal(e.code, 'USERDATA_CLOUDCONFIG_INVALID');
      assert.equal(e.kind, 'terminal');
      assert.equal(e.field, 'userData');
      assert.match(e.message, /line 5, column 4/);
      assert.ok(!e.message.includes(secret));
      return true;
    },
  );
});

test('gzip-compressed #cloud-config is linted after decompression', () => {
  const bad = new Uint8Array(gzipSync('#cloud-config\n- a\n'));
  assert.throws(() => lintUserData(bad, 'f'), /must be a YAML mapping/);
  assert.deepEqual(lintUserData(new Uint8Array(gzipSync('#cloud-config\na: 1\n')), 'f'), []);
});

test('duplicate keys are accepted as PyYAML does (last wins)', () => {
  assert.deepEqual(lintUserData(new Uint8Array(Buffer.from('#cloud-config\na: 1\na: 2\n')), 'f'), []);
});
