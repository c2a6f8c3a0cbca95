// Harness test: the secret forms really are what base64, JSON and URL
// encoders make of a text holding the secret, at any position.
import assert from 'node:assert/strict';
import test from 'node:test';
import { findSecret, secretForms } from './secret-forms.ts';

const SECRET = 'MRKa1b2c3d4e5f6token';

test('harness: a secret is found in the base64 of any text that holds it, at every offset', () => {
  const forms = secretForms(SECRET);
  for (let pad = 0; pad < 7; pad++) {
    const text = `${'#cloud-config\n'.slice(0, pad)}runcmd: [echo ${SECRET}]\n`;
    const b64 = Buffer.from(text).toString('base64');
    assert.ok(findSecret(b64, forms)?.form.startsWith('base64'), `pad ${pad}: ${b64}`);
    assert.ok(findSecret(Buffer.from(text).toString('base64url'), forms), `pad ${pad}: base64url`);
    assert.equal(findSecret(Buffer.from(text.replace(SECRET, 'x')).toString('base64'), forms), undefined);
  }
});

test('harness: JSON-escaped, URL-encoded and hex forms are found', () => {
  const serial = 'ds=nocloud;s=http://10.0.0.1/v1/abc/\n';
  const forms = secretForms(serial);
  assert.equal(findSecret(JSON.stringify({ m: serial }), forms)?.form, 'JSON-escaped');
  assert.equal(findSecret(`?u=${encodeURIComponent(serial)}`, forms)?.form, 'URL-encoded');
  assert.equal(findSecret(Buffer.from(serial).toString('hex'), forms)?.form, 'hex');
  assert.equal(findSecret('nothing here', forms), undefined);
});
