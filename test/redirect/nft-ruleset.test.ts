// The redirect ruleset: what goes into nft's input is checked (no flag can
// inject nft syntax), and the check recognises only our rule, read from a
// real `nft -j` listing in a namespace of the test's own.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { VmseedError } from '../../src/errors.ts';
import {
  checkSpec,
  launcherSetElements,
  renderLauncherSync,
  renderRuleset,
  ruleInPlace,
  type RedirectSpec,
} from '../../src/redirect/nft-ruleset.ts';
import { sh } from '../support/netns.ts';
import { randomBytes } from 'node:crypto';

const spec: RedirectSpec = {
  table: 'vmseed',
  to: { host: '192.0.2.1', port: 8081 },
  podInterfaces: ['veth*', 'cali*'],
  metadata: { address: '169.254.169.254', port: 80 },
};

test('inputs that could reach nft syntax are refused with REDIRECT_INVALID and the field', () => {
  const bad: Array<[Partial<RedirectSpec>, string]> = [
    [{ table: 'x; flush ruleset' }, 'table'],
    [{ to: { host: '192.0.2.1 ; flush ruleset', port: 1 } }, 'to'],
    [{ to: { host: 'example.com', port: 1 } }, 'to'],
    [{ to: { host: '192.0.2.1', port: 70000 } }, 'to'],
    [{ podInterfaces: ['veth*" } accept; #'] }, 'pod-interface'],
    [{ podInterfaces: ['a*b'] }, 'pod-interface'],
    [{ podInterfaces: ['sixteen-chars-xx'] }, 'pod-interface'],
    [{ podInterfaces: [] }, 'pod-interface'],
    [{ metadata: { address: '::1', port: 80 } }, 'metadata-address'],
  ];
  for (const [patch, field] of bad) {
    assert.throws(
      () => checkSpec({ ...spec, ...patch }),
      (e: unknown) => e instanceof VmseedError && e.code === 'REDIRECT_INVALID' && e.field === field,
      JSON.stringify(patch),
    );
  }
  assert.doesNotThrow(() => checkSpec(spec));
});

test('the ruleset: its own table re-created in one transaction, a nat prerouting chain before iptables-nft, one DNAT rule for launchers only', () => {
  const text = renderRuleset(spec, ['192.0.2.7', '192.0.2.8', '192.0.2.9 } ; flush ruleset', '::1']);
  assert.match(text, /set launchers \{\n\s+type ipv4_addr;\n\s+\}/);
  // Only IPv4 addresses reach nft's input.
  assert.match(text, /\nadd element ip vmseed launchers \{ 192\.0\.2\.7, 192\.0\.2\.8 \}\n$/);
  assert.equal(renderLauncherSync(spec, []), 'flush set ip vmseed launchers\n');
  const every = renderRuleset({ ...spec, allPods: true });
  assert.doesNotMatch(every, /launchers/);
  assert.match(every, /iifname \{ "veth\*", "cali\*" \} ip daddr 169\.254\.169\.254 tcp dport 80 counter dnat/);
  assert.match(text, /^table ip vmseed \{\}\ndelete table ip vmseed\ntable ip vmseed \{/);
  assert.match(text, /type nat hook prerouting priority dstnat - 10;/);
  assert.match(
    text,
    /iifname \{ "veth\*", "cali\*" \} ip saddr @launchers ip daddr 169\.254\.169\.254 tcp dport 80 counter dnat to 192\.0\.2\.1:8081 comment "vmseed-redirect [0-9a-f]{16}"/,
  );
  assert.doesNotMatch(text, /\b(nat|filter) (PREROUTING|INPUT)\b|table ip nat/, 'never another table');
});

test("ruleInPlace reads nft's own JSON: ours is in place; another target, a flushed chain or no table is not", async (t) => {
  const ns = `vmseed-${randomBytes(3).toString('hex')}-nft`;
  await sh(['ip', 'netns', 'add', ns]);
  t.after(() => sh(['ip', 'netns', 'del', ns]).then(() => {}));
  const nft = (args: string[], input?: string) =>
    sh(['ip', 'netns', 'exec', ns, 'nft', ...args], input === undefined ? {} : { input });
  const list = async () => (await nft(['-j', 'list', 'table', 'ip', 'vmseed'])).stdout;
  await nft(['-f', '-'], renderRuleset(spec));
  assert.equal(ruleInPlace(await list(), spec), true);
  assert.deepEqual(launcherSetElements(await list(), spec), []);
  await nft(['-f', '-'], renderLauncherSync(spec, ['192.0.2.9', '192.0.2.3']));
  assert.deepEqual(launcherSetElements(await list(), spec), ['192.0.2.3', '192.0.2.9']);
  assert.equal(ruleInPlace(await list(), { ...spec, allPods: true }), false, 'the every-pod rule is another rule');
  assert.equal(
    ruleInPlace(await list(), { ...spec, to: { host: '192.0.2.9', port: 8081 } }),
    false,
    'another configuration',
  );
  assert.equal(ruleInPlace(await list(), { ...spec, podInterfaces: ['veth*'] }), false, 'another interface list');
  await nft(['flush', 'chain', 'ip', 'vmseed', 'prerouting']);
  assert.equal(ruleInPlace(await list(), spec), false, 'flushed chain');
  assert.equal(ruleInPlace('not json', spec), false);
  assert.equal(ruleInPlace('{"nftables":[]}', spec), false);
});
