import { test } from 'node:test';
import assert from 'node:assert/strict';
import { lintVendorData, parseVendorDataFrom, vendorDataFile } from '../../../src/cloudinit/userdata/vendor-data.ts';

const b = (s: string) => new Uint8Array(Buffer.from(s));

test('--vendor-data-from parses namespace/name[/key] and refuses the rest', () => {
  assert.deepEqual(parseVendorDataFrom('vmseed-system/vendor'), { namespace: 'vmseed-system', name: 'vendor' });
  assert.deepEqual(parseVendorDataFrom('ns/cm/site.yaml'), { namespace: 'ns', name: 'cm', key: 'site.yaml' });
  for (const bad of ['vendor', 'ns/', '/cm', 'ns/cm/k/x', 'NS/cm', 'ns/cm/bad key']) {
    assert.throws(() => parseVendorDataFrom(bad), { code: 'CONFIG_INVALID', field: '--vendor-data-from' }, bad);
  }
});

test('ConfigDrive vendor_data.json is {"cloud-init": text}; NoCloud keeps the bytes', () => {
  const text = '#cloud-config\nruncmd: [[echo, "quoted \\"x\\""]]\n';
  assert.equal(
    Buffer.from(vendorDataFile(b(text), 'configdrive', 'f')).toString(),
    JSON.stringify({ 'cloud-init': text }),
  );
  assert.deepEqual(vendorDataFile(b(text), 'nocloud', 'f'), b(text));
  assert.throws(() => vendorDataFile(new Uint8Array([0x1f, 0x8b, 0xff]), 'configdrive', 'f'), {
    code: 'VENDORDATA_INVALID',
  });
});

test('vendor-data lint: size, YAML errors and missing headers', () => {
  assert.throws(() => lintVendorData(b('#cloud-config\n'), 'f', 5), { code: 'VENDORDATA_INVALID' });
  assert.throws(() => lintVendorData(b('#cloud-config\na: [\n'), 'f', 100), { code: 'VENDORDATA_INVALID', field: 'f' });
  assert.deepEqual(
    lintVendorData(b('packages: [x]\n'), 'f', 100).map((w) => w.code),
    ['VENDORDATA_NO_HEADER'],
  );
  assert.deepEqual(lintVendorData(b('#!/bin/sh\ntrue\n'), 'f', 100), []);
});
