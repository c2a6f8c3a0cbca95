// A guest that holds its own token (VMI A) throws odd request targets at the
// datasource. Whatever it sends, it must never see VMI B's seed, and the
// server must keep answering. A 200 is only allowed for the exact paths
// that name one of A's files, and must carry exactly that file.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import fc from 'fast-check';
import { metaDataBytes } from '../../src/cloudinit/seed-files.ts';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { MapDirectory, nocloudSeed, quietLogger, randomKey, rawRequest } from './datasource-fixtures.ts';

const FILES = ['meta-data', 'user-data', 'vendor-data', 'network-config'] as const;
const B_MARKERS = ['secret-of-b', 'vendor-b', 'host-b', 'iid-b'];

describe('path fuzz: no cross-VMI reads, no crash', () => {
  const dir = new MapDirectory();
  const keyring = new DatasourceKeyring([randomKey()]);
  const seedA = nocloudSeed('a');
  let server: DatasourceServer;
  let tokA: string;
  let expected: Map<string, Uint8Array>;

  before(async () => {
    dir.add({ namespace: 'ns', name: 'vm-a', uid: 'uid-a', seed: seedA }, ['127.0.0.1']);
    dir.add({ namespace: 'ns', name: 'vm-b', uid: 'uid-b', seed: nocloudSeed('b') });
    tokA = keyring.sign('uid-a');
    const bytes = {
      'meta-data': metaDataBytes(seedA),
      'user-data': seedA.userData,
      'vendor-data': seedA.vendorData!,
      'network-config': seedA.networkConfig!,
    };
    // The oracle: the only targets allowed to answer 200, written out by
    // hand from cloud-init's URL forms rather than derived from the parser.
    expected = new Map();
    for (const f of FILES) {
      expected.set(`/v1/${tokA}/${f}`, bytes[f]);
      expected.set(`/v1/${tokA}${f}`, bytes[f]);
    }
    server = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory: dir,
      keyring,
      logger: quietLogger,
      limits: { ratePerSecond: 1e6, burst: 1e6 },
    });
  });
  after(() => server.close());

  async function check(target: Buffer): Promise<number> {
    const r = await rawRequest(server.address.port, target);
    const body = r.body.toString('latin1');
    for (const m of B_MARKERS)
      assert.ok(!body.includes(m), `VMI B's data leaked for ${JSON.stringify(target.toString('latin1'))}`);
    assert.equal(r.headers['cache-control'], 'no-store', `no-store missing (status ${r.status})`);
    // Spaces around the target are request-line separators (`GET SP target
    // SP HTTP/1.1`): Node's parser drops extra ones, so the server sees the
    // target without them (checked: "GET  /v1/x HTTP/1.1" arrives as "/v1/x").
    const want = expected.get(target.toString('latin1').replace(/^ +| +$/g, ''));
    if (r.status === 200) {
      assert.ok(want, `200 for a target that names no file of A: ${JSON.stringify(target.toString('latin1'))}`);
      assert.deepEqual(new Uint8Array(r.body), new Uint8Array(want));
    } else {
      assert.ok(want === undefined, `valid target refused (${r.status}): ${target.toString('latin1')}`);
      assert.ok([400, 404, 414, 431].includes(r.status), `unexpected status ${r.status}`);
      assert.ok(!/at .*\.ts:\d+|Error:/.test(body), 'stack trace or error text in the body');
    }
    return r.status;
  }

  test('fixed list of traversal and encoding tricks', async () => {
    const t = () => tokA;
    const targets = [
      `/v1/${t()}/user-data`,
      `/v1/${t()}user-data`,
      `/v1/${t()}/../uid-b/user-data`,
      `/v1/${t()}/%2e%2e/user-data`,
      `/v1/${t()}/%252e%252e/user-data`,
      `/v1/${t()}%2fuser-data`,
      `/v1/${t()}/user-data%00`,
      `/v1/${t()}/user-data\0`,
      `/v1/${t()}/user-data/`,
      `/v1/${t()}//user-data`,
      `/v1//${t()}/user-data`,
      `/v1/${t()}/./user-data`,
      `/v1/${t()}/user-data?x=1`,
      `/v1/${t()}/user-data#frag`,
      `/v1/${t()}/user%2ddata`,
      `/v1/${t()}/USER-DATA`,
      `/v1/${t().slice(0, 42)}/user-data`,
      `/v1/${t()}A/user-data`,
      `/V1/${t()}/user-data`,
      `/v1/../v1/${t()}/user-data`,
      `/v1/%2e%2e/etc/passwd`,
      `/v1/..%c0%af..%c0%afetc/passwd`,
      `/v1/${t()}/..\\user-data`,
      `/v1/${encodeURIComponent(t())}/user-data`,
      `//169.254.169.254/v1/${t()}/user-data`,
      `http://169.254.169.254/v1/${t()}/user-data`,
      `*`,
      `/v1/${t()}/user-data\u202e`,
      `/v1/${t()}/ü`,
      `/v1/${'A'.repeat(43)}/user-data`,
      `/v1/user-data`, // compat off: 404
      `/v1/${t()}/${'a'.repeat(10_000)}`,
      `/${'../'.repeat(2000)}etc/passwd`,
    ];
    for (const target of targets) await check(Buffer.from(target, 'utf8'));
  });

  test("property: random targets built from A's token, names, traversal and encodings", async () => {
    const piece = fc.oneof(
      fc.constantFrom(
        '..',
        '.',
        '%2e%2e',
        '%252e',
        '%2f',
        '%5c',
        '%00',
        '\0',
        '',
        'v1',
        'V1',
        ';',
        '?',
        '#',
        '%',
        '%%',
        ...FILES,
        'uid-b',
        'vm-b',
        '\u00e9',
        '\u{1f600}',
        '\u202e',
        '\r',
        '\t',
        ' ',
      ),
      fc.constant('TOKEN_A'),
      fc.constant('TOKEN_A_PREFIX'),
      fc.string({ maxLength: 12 }),
      fc.string({ unit: 'binary', maxLength: 6 }),
      fc.integer({ min: 0, max: 3000 }).map((n) => 'x'.repeat(n)),
    );
    const randomTarget = fc
      .tuple(
        fc.constantFrom('/v1/', '/v1', '/', '', '//', '/v1//'),
        fc.array(piece, { maxLength: 6 }),
        fc.constantFrom('/', ''),
      )
      .map(([start, pieces, sep]) =>
        (start + pieces.join(sep)).replaceAll('TOKEN_A_PREFIX', tokA.slice(0, 20)).replaceAll('TOKEN_A', tokA),
      );
    // Valid targets, half of them with one piece of junk spliced in somewhere.
    const nearValid = fc
      .tuple(fc.constantFrom(...FILES), fc.constantFrom('/', ''), fc.option(piece, { nil: undefined }), fc.nat(80))
      .map(([file, sep, junk, at]) => {
        const valid = `/v1/${tokA}${sep}${file}`;
        if (junk === undefined) return valid;
        const j = junk.replaceAll('TOKEN_A_PREFIX', tokA.slice(0, 20)).replaceAll('TOKEN_A', tokA);
        const i = at % (valid.length + 1);
        return valid.slice(0, i) + j + valid.slice(i);
      });
    const target = fc.oneof(randomTarget, nearValid);
    const seen = new Map<number, number>();
    await fc.assert(
      fc.asyncProperty(target, async (t) => {
        const status = await check(Buffer.from(t, 'utf8'));
        seen.set(status, (seen.get(status) ?? 0) + 1);
      }),
      { numRuns: 400 },
    );
    // The generator must reach both sides of the oracle, or it proves little.
    assert.ok((seen.get(200) ?? 0) > 0, `no 200 in the run: ${JSON.stringify([...seen])}`);
    assert.ok((seen.get(404) ?? 0) > 0, `no 404 in the run: ${JSON.stringify([...seen])}`);
    // Still serving after the barrage.
    const r = await rawRequest(server.address.port, `/v1/${tokA}/meta-data`);
    assert.equal(r.status, 200);
  });

  test("property: tokens one edit away from A's (or B-shaped guesses) never read anything", async () => {
    const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
    await fc.assert(
      fc.asyncProperty(fc.nat(42), fc.nat(alphabet.length - 1), fc.constantFrom(...FILES), async (pos, ch, file) => {
        const c = alphabet[ch];
        fc.pre(tokA[pos] !== c);
        const mutated = tokA.slice(0, pos) + c + tokA.slice(pos + 1);
        const r = await rawRequest(server.address.port, `/v1/${mutated}/${file}`);
        assert.equal(r.status, 404);
        assert.equal(r.body.toString(), 'not found\n');
      }),
      { numRuns: 150 },
    );
  });
});
