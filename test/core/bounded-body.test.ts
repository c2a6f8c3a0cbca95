// The bounded body reader the webhook and the progress-report receiver share.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import { readBoundedBody } from '../../src/core/bounded-body.ts';

test('a body of up to the cap is read whole, in order', async () => {
  const req = new PassThrough();
  const body = readBoundedBody(req, 10);
  req.write('hello ');
  // Exactly the cap.
  req.end('worl');
  assert.deepEqual(await body, Buffer.from('hello worl'));
});

test('one byte over the cap: too-large at once, and the request is paused with the rest unread', async () => {
  const req = new PassThrough();
  const body = readBoundedBody(req, 10);
  req.write('0123456789');
  req.write('x');
  assert.equal(await body, 'too-large');
  assert.equal(req.isPaused(), true);
  req.write('more');
  assert.equal(req.readableLength, 4, 'nothing read past the cap');
});

test('a request that errors or closes before its end is aborted', async () => {
  const errored = new PassThrough();
  const a = readBoundedBody(errored, 10);
  errored.write('part');
  errored.destroy(new Error('reset'));
  assert.equal(await a, 'aborted');
  const closed = new PassThrough();
  const b = readBoundedBody(closed, 10);
  closed.write('part');
  closed.destroy();
  assert.equal(await b, 'aborted');
});
