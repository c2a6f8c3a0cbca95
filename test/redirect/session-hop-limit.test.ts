// `vmseed redirect --session-hop-limit N`: the two chains it adds to the
// redirect's own table, what --print shows, the values refused, and the
// check that finds them (or not) in a real `nft -j` listing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { PassThrough, Readable } from 'node:stream';
import { VmseedError } from '../../src/errors.ts';
import { redirect } from '../../src/commands/redirect.ts';
import {
  CT_DECIDED,
  CT_SESSION,
  SESSION_MARK_CHAIN,
  SESSION_TTL_CHAIN,
  checkSpec,
  renderRuleset,
  ruleInPlace,
  specDigest,
  type RedirectSpec,
} from '../../src/redirect/nft-ruleset.ts';
import { sh } from '../support/netns.ts';

const spec: RedirectSpec = {
  table: 'vmseed',
  to: { host: '192.0.2.1', port: 8081 },
  podInterfaces: ['veth*'],
  metadata: { address: '169.254.169.254', port: 80 },
};
const limited: RedirectSpec = { ...spec, sessionHopLimit: 2 };

async function run(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = new PassThrough();
  const err = new PassThrough();
  let stdout = '';
  let stderr = '';
  out.on('data', (c: Buffer) => (stdout += c.toString()));
  err.on('data', (c: Buffer) => (stderr += c.toString()));
  const code = await redirect({
    argv,
    stdout: out,
    stderr: err,
    stdin: Readable.from([]),
    env: {},
    cwd: '/',
    stopSignal: new AbortController().signal,
  });
  return { code, stdout, stderr };
}

test('off by default: no chain but the DNAT; the digest tells the two apart', () => {
  const text = renderRuleset(spec);
  assert.doesNotMatch(text, /session|ttl|ct mark/);
  assert.notEqual(specDigest(limited), specDigest(spec));
  assert.notEqual(specDigest(limited), specDigest({ ...spec, sessionHopLimit: 3 }));
});

test('the chains: connections judged by their first data segment after the DNAT, their answers TTL N at postrouting', () => {
  const text = renderRuleset(limited, ['192.0.2.2']);
  const decided = `0x${CT_DECIDED.toString(16)}`;
  const both = `0x${(CT_DECIDED | CT_SESSION).toString(16)}`;
  const session = `0x${CT_SESSION.toString(16)}`;
  assert.match(
    text,
    new RegExp(`chain ${SESSION_MARK_CHAIN} \\{\\n\\s+type filter hook prerouting priority dstnat \\+ 10;`),
  );
  const guard =
    'ip daddr 192\\.0\\.2\\.1 tcp dport 8081 ct direction original ct status dnat ct original ip daddr 169\\.254\\.169\\.254';
  // "GET ", "HEAD", "POST": plain.
  assert.match(
    text,
    new RegExp(
      `${guard} ct mark & ${decided} == 0 @ih,0,32 \\{ 0x47455420, 0x48454144, 0x504f5354 \\} ct mark set ct mark \\| ${decided}\\n`,
    ),
  );
  assert.match(
    text,
    new RegExp(`${guard} ct mark & ${decided} == 0 @ih,0,8 & 0x0 == 0x0 ct mark set ct mark \\| ${both} counter`),
  );
  assert.match(text, new RegExp(`chain ${SESSION_TTL_CHAIN} \\{\\n\\s+type filter hook postrouting priority filter;`));
  assert.match(text, new RegExp(`ct direction reply ct mark & ${session} == ${session} ip ttl set 2 counter`));
  assert.doesNotMatch(text, /table ip (nat|filter|mangle)/, 'never another table');
});

test('--session-hop-limit: 1 to 255, digits only; --print shows the chains', async () => {
  for (const bad of [0, 256, 1.5, -1, NaN])
    assert.throws(
      () => checkSpec({ ...spec, sessionHopLimit: bad }),
      (e: unknown) => e instanceof VmseedError && e.code === 'REDIRECT_INVALID' && e.field === 'session-hop-limit',
      String(bad),
    );
  for (const bad of ['0', '256', 'x', ' 2', '0x2', '2e0', ''])
    assert.equal((await run(['--to', '192.0.2.1:8081', '--session-hop-limit', bad, '--print'])).code, 2, bad);
  const printed = await run(['--to', '192.0.2.1:8081', '--session-hop-limit', '2', '--print']);
  assert.equal(printed.code, 0, printed.stderr);
  assert.match(printed.stdout, /ip ttl set 2 counter comment "vmseed-session-ttl [0-9a-f]{16}"/);
  const plain = await run(['--to', '192.0.2.1:8081', '--print']);
  assert.doesNotMatch(plain.stdout, /ttl/);
  assert.match((await run(['--help'])).stdout, /--session-hop-limit N/);
});

test("ruleInPlace with a hop limit needs both chains and rules, from nft's own JSON", async (t) => {
  const ns = `vmseed-${randomBytes(3).toString('hex')}-hop`;
  await sh(['ip', 'netns', 'add', ns]);
  t.after(() => sh(['ip', 'netns', 'del', ns]).then(() => {}));
  const nft = (args: string[], input?: string) =>
    sh(['ip', 'netns', 'exec', ns, 'nft', ...args], input === undefined ? {} : { input });
  const list = async () => (await nft(['-j', 'list', 'table', 'ip', 'vmseed'])).stdout;
  await nft(['-f', '-'], renderRuleset(limited));
  assert.equal(ruleInPlace(await list(), limited), true);
  assert.equal(ruleInPlace(await list(), spec), false, 'another configuration: another digest');
  assert.equal(ruleInPlace(await list(), { ...spec, sessionHopLimit: 3 }), false);
  await nft(['flush', 'chain', 'ip', 'vmseed', SESSION_MARK_CHAIN]);
  assert.equal(ruleInPlace(await list(), limited), false, 'the marking rules flushed');
  await nft(['-f', '-'], renderRuleset(limited));
  await nft(['delete', 'chain', 'ip', 'vmseed', SESSION_TTL_CHAIN]);
  assert.equal(ruleInPlace(await list(), limited), false, 'the TTL chain gone');
  await nft(['-f', '-'], renderRuleset(spec));
  assert.equal(ruleInPlace(await list(), spec), true);
  assert.equal(ruleInPlace(await list(), limited), false);
});
