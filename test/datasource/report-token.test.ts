import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { reportMessage, reportToken, reportUrl } from '../../src/datasource/reports/report-token.ts';

const key = (b: number) => new Uint8Array(32).fill(b);
const UID = '6c3463a0-44c0-430a-9828-bd2198b39102';

test('a report token verifies for its VMI only, and is never the seed token', () => {
  const ring = new DatasourceKeyring([key(1)]);
  const t = reportToken(ring, UID);
  assert.equal(ring.verify(t, reportMessage(UID)), true);
  assert.equal(ring.verify(t, reportMessage('00000000-0000-4000-8000-000000000000')), false);
  assert.notEqual(t, ring.sign(UID));
  assert.equal(ring.verify(t, UID), false, 'the report token does not open the seed');
  assert.equal(new DatasourceKeyring([key(2)]).verify(t, reportMessage(UID)), false);
});

test('a report URL is the base, the token and the events path', () => {
  assert.equal(reportUrl('http://169.254.169.254/v1/', 'T'), 'http://169.254.169.254/v1/T/cloud-init-events');
});
