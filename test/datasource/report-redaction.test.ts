// What the guest may not get into a progress description: each kind of
// credential the redactor knows is replaced, and the words around it stay.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseReportedEvent, redactDescription } from '../../src/datasource/reports/event.ts';

const R = '[redacted]';

function redacts(input: string, want: string, secrets: string[]): void {
  const got = redactDescription(input);
  assert.equal(got, want);
  for (const secret of secrets) assert.ok(!got.includes(secret), `${secret} left in ${got}`);
}

test('key=value and key: value for a secret-sounding key: the pair goes, the sentence stays', () => {
  redacts('login failed: password=hunter2 for alice', `login failed: ${R} for alice`, ['hunter2']);
  redacts('retrying with passwd: hunter2 now', `retrying with ${R} now`, ['hunter2']);
  redacts('using secret = s3cr3t-value here', `using ${R} here`, ['s3cr3t']);
  redacts('user: password=hunter2 end', `user: ${R} end`, ['hunter2']);
  redacts('monkey=banana keyboard=us tokens=3 ran', 'monkey=banana keyboard=us tokens=3 ran', []);
});

test('several key=value secrets in one line: every one goes', () => {
  redacts('password=pw1 token=tk2 secret: sc3 key = ky4 authorization: au5 done', `${R} ${R} ${R} ${R} ${R} done`, [
    'pw1',
    'tk2',
    'sc3',
    'ky4',
    'au5',
  ]);
});

test('a secret word inside a snake_case or camelCase key name', () => {
  redacts(
    'env DB_PASSWORD=pw1 client_secret=sc2 accessToken: tk3 APIKey=ky4 AWS_SECRET_ACCESS_KEY=ak5 kept',
    `env ${R} ${R} ${R} ${R} ${R} kept`,
    ['pw1', 'sc2', 'tk3', 'ky4', 'ak5'],
  );
});

test('URL user-info: user and password go, scheme-less host and path stay', () => {
  redacts('GET https://user:s3cret@example.com/seed failed', `GET ${R}example.com/seed failed`, ['s3cret', 'user']);
  redacts('mirror ftp://anonymous@mirror.example/x ok', `mirror ${R}mirror.example/x ok`, ['anonymous']);
});

test('Bearer <token>: the token goes, also after an Authorization header name', () => {
  redacts('retry with Bearer abc.def-123 after 401', `retry with ${R} after 401`, ['abc.def-123']);
  redacts('sent Authorization: Bearer s3cr3t to the proxy', `sent ${R} to the proxy`, ['s3cr3t']);
});

test('long base64 or hex runs (32 characters and more) go; shorter words stay', () => {
  const key = 'AAAAB3NzaC1yc2EAAAADAQABAAABAQC7vbqajDhA==';
  const hash = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855';
  redacts(`fingerprint ${key} end`, `fingerprint ${R} end`, ['AAAAB3NzaC1yc2E']);
  redacts(`sha256 ${hash} ok`, `sha256 ${R} ok`, ['e3b0c442']);
  redacts(`x ${'y'.repeat(32)} z`, `x ${R} z`, ['y']);
  const short = 'y'.repeat(31);
  redacts(`instance iid-datasource-nocloud ${short} up`, `instance iid-datasource-nocloud ${short} up`, []);
});

test('the receiver keeps the redacted description', () => {
  const r = parseReportedEvent(
    JSON.stringify({ name: 'init-network', event_type: 'start', timestamp: 1, description: 'token=tk1 running' }),
  );
  assert.ok(r.ok);
  assert.equal(r.event.description, `${R} running`);
});
