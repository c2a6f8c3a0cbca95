// The datasource's request screen and file bytes on their own, without a
// socket: the order of the checks and the empty-file fallbacks.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { IncomingMessage } from 'node:http';
import { RequestScreen } from '../../src/datasource/flood/screen.ts';
import { SeedFileBytes } from '../../src/datasource/bytes.ts';
import { nocloudSeed } from './datasource-fixtures.ts';

function request(method: string, headers: Record<string, string> = {}): IncomingMessage {
  return { method, headers } as unknown as IncomingMessage;
}

const screen = (burst: number) =>
  new RequestScreen({ maxUrlLength: 10, ratePerSecond: 1, burst, maxTrackedSources: 10, now: () => 0 });

test('screen: the rate limit comes first and every request takes a token, refused or not', () => {
  const s = screen(2);
  assert.equal(s.check(request('POST'), '/too/long/target', 'a')?.status, 414);
  assert.equal(s.check(request('POST'), '/v1', 'a')?.status, 405);
  assert.equal(s.check(request('GET'), '/v1', 'a')?.status, 429);
  assert.equal(s.check(request('GET'), '/v1', 'b'), undefined);
});

test('screen: a body announced by length or chunking is refused; Content-Length 0 is not', () => {
  const s = screen(10);
  assert.equal(s.check(request('GET', { 'content-length': '1' }), '/v1', 'a')?.status, 400);
  assert.equal(s.check(request('HEAD', { 'transfer-encoding': 'chunked' }), '/v1', 'a')?.status, 400);
  assert.equal(s.check(request('GET', { 'content-length': '0' }), '/v1', 'a'), undefined);
  const refusal = s.check(request('PUT'), '/v1', 'a');
  assert.deepEqual(refusal?.headers, { Allow: 'GET, HEAD', Connection: 'close' });
  assert.equal(refusal?.body.toString(), 'method not allowed\n');
});

test('file bytes: meta-data rendered once per seed; empty vendor-data/network-config only when asked', () => {
  const seed = nocloudSeed('x', { vendorData: undefined, networkConfig: undefined });
  const on = new SeedFileBytes({ serveEmptyVendorData: true, serveEmptyNetworkConfig: true });
  const metaData = on.of(seed, 'meta-data');
  assert.ok(metaData !== undefined && metaData.byteLength > 0);
  assert.equal(on.of(seed, 'meta-data'), metaData);
  assert.equal(on.of(seed, 'vendor-data')?.byteLength, 0);
  assert.equal(on.of(seed, 'network-config')?.byteLength, 0);
  assert.equal(on.of(seed, 'user-data'), seed.userData);
  const off = new SeedFileBytes({ serveEmptyVendorData: false, serveEmptyNetworkConfig: false });
  assert.equal(off.of(seed, 'vendor-data'), undefined);
  assert.equal(off.of(seed, 'network-config'), undefined);
  const configDrive = { ...seed, datasource: 'configdrive' as const };
  assert.equal(on.of(configDrive, 'vendor-data'), undefined);
  assert.equal(on.of(configDrive, 'meta-data'), undefined);
});
