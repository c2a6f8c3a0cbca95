// Budgets on input: strict base64 through Buffer, bounded YAML
// (aliases, depth, expanded size, cycles), the running seed budget.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { decodeBase64Strict } from '../../src/cloudinit/base64.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { ANNOTATION } from '../../src/cloudinit/annotation/annotation.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { measureExpanded, parseYaml } from '../../src/cloudinit/yaml.ts';
import { LIMITS } from '../../src/cloudinit/limits.ts';

// The character-at-a-time decoder this replaced: the oracle for the answer
// and for the position named in an error.
function reference(text: string): { ok: true; bytes: Buffer } | { ok: false; position: number } {
  let clean = '';
  const positions: number[] = [];
  for (let i = 0; i < text.length; i++) {
    if (text[i] === '\r' || text[i] === '\n') continue;
    clean += text[i];
    positions.push(i);
  }
  let padStart = -1;
  for (let i = 0; i < clean.length; i++) {
    const inAlphabet = /[A-Za-z0-9+/]/.test(clean[i]);
    if (clean[i] === '=') {
      if (padStart < 0) padStart = i;
      continue;
    }
    if (!inAlphabet || padStart >= 0) return { ok: false, position: positions[i] + 1 };
  }
  if (padStart >= 0 && clean.length - padStart > 2) return { ok: false, position: positions[padStart] + 1 };
  if (clean.length % 4 !== 0) return { ok: false, position: text.length };
  return { ok: true, bytes: Buffer.from(clean, 'base64') };
}

test('strict base64 agrees with the reference decoder on valid and broken text', () => {
  const alphabet = 'ABCxyz019+/=\r\n-_ .'.split('');
  const noisy = fc.array(fc.constantFrom(...alphabet), { maxLength: 40 }).map((a) => a.join(''));
  const valid = fc.uint8Array({ maxLength: 64 }).map((b) =>
    Buffer.from(b)
      .toString('base64')
      .replace(/(.{8})/g, '$1\n'),
  );
  fc.assert(
    fc.property(fc.oneof(noisy, valid), (text) => {
      const want = reference(text);
      const got = decodeBase64Strict(text);
      assert.equal(got.ok, want.ok, JSON.stringify(text));
      if (got.ok && want.ok) assert.deepEqual(Buffer.from(got.bytes), want.bytes);
      if (!got.ok && !want.ok) assert.equal(got.position, want.position, JSON.stringify(text));
    }),
    { numRuns: 2000 },
  );
});

test('a 1 MiB base64 value decodes to the same bytes as Buffer', () => {
  const bytes = Buffer.alloc(768 * 1024);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7919) & 0xff;
  const r = decodeBase64Strict(bytes.toString('base64'));
  assert.ok(r.ok);
  assert.ok(Buffer.from(r.bytes).equals(bytes));
  const broken = decodeBase64Strict(
    `${bytes.toString('base64').slice(0, 1000)}!${bytes.toString('base64').slice(1001)}`,
  );
  assert.deepEqual(broken.ok ? undefined : broken.position, 1001);
});

test('YAML: aliases past the cap, nesting past the cap and recursive aliases are YAML_TOO_COMPLEX with the field', () => {
  const aliases = `a: &a 1\nb: [${Array.from({ length: LIMITS.yamlAliases + 1 }, () => '*a').join(', ')}]\n`;
  assert.throws(() => parseYaml(aliases, { field: 'f' }), { code: 'YAML_TOO_COMPLEX', field: 'f', kind: 'terminal' });
  const fewer = `a: &a 1\nb: [${Array.from({ length: LIMITS.yamlAliases }, () => '*a').join(', ')}]\n`;
  assert.equal(parseYaml(fewer).ok, true);
  assert.throws(
    () => parseYaml(`${'['.repeat(LIMITS.yamlDepth + 1)}${']'.repeat(LIMITS.yamlDepth + 1)}`, { field: 'f' }),
    { code: 'YAML_TOO_COMPLEX' },
  );
  assert.throws(() => parseYaml('a: &a [*a]', { field: 'f' }), /recursive alias/);
  // A syntax error is still a result, not a throw.
  assert.equal(parseYaml('a: [', { field: 'f' }).ok, false);
});

test('YAML: the expanded size is bounded, counting shared nodes each time they are reached', () => {
  const leaf = 'x'.repeat(100);
  const shared = [leaf, leaf];
  const doc = { a: shared, b: shared, c: shared };
  const size = measureExpanded(doc, 1e6);
  assert.equal(typeof size, 'number');
  assert.ok((size as number) > 600);
  assert.equal(measureExpanded(doc, 500), 'over');
  const cyclic: unknown[] = [];
  cyclic.push(cyclic);
  assert.equal(measureExpanded(cyclic, 1e6), 'cycle');
  // Parsed documents are measured on the parser's events, before objects
  // exist: 4 levels of 5 aliases expand 625 times, past 4 × the text.
  const bomb = [
    'l0: &l0 "xxxxxxxxxxxxxxxx"',
    ...[1, 2, 3, 4].map(
      (i) =>
        `l${i}: &l${i} [${Array(5)
          .fill(`*l${i - 1}`)
          .join(', ')}]`,
    ),
  ].join('\n');
  assert.throws(() => parseYaml(bomb, { field: 'f', maxExpandedBytes: 1000 }), {
    code: 'YAML_TOO_COMPLEX',
    field: 'f',
  });
  assert.equal(parseYaml(bomb, { field: 'f', maxExpandedBytes: 100_000 }).ok, true);
});

test('YAML over 256 KiB: its own size × 4, not the 1 MiB default, bounds its expansion (~3× accepted, ~5× refused)', () => {
  // One anchored scalar of 400 KiB and `aliases` aliases to it: the text is
  // ~400 KiB (over 1 MiB / 4), the expansion ~(aliases + 1) × that.
  const big = 'x'.repeat(400 * 1024);
  const doc = (aliases: number) =>
    `a: &a ${big}\n${Array.from({ length: aliases }, (_, i) => `b${i}: *a`).join('\n')}\n`;
  const ratio = (aliases: number, text: string) => {
    const value: Record<string, string> = { a: big };
    for (let i = 0; i < aliases; i++) value[`b${i}`] = big;
    return (measureExpanded(value, Infinity) as number) / text.length;
  };
  const three = doc(2);
  const five = doc(4);
  assert.ok(three.length > LIMITS.yamlExpandedBytes / 4 && five.length > LIMITS.yamlExpandedBytes / 4);
  const r3 = ratio(2, three);
  const r5 = ratio(4, five);
  assert.ok(r3 > 2.9 && r3 < 3.1 && r3 * three.length > LIMITS.yamlExpandedBytes, `~3×, past 1 MiB: ${r3}`);
  assert.ok(r5 > 4.9 && r5 < 5.1, `~5×: ${r5}`);
  const ok = parseYaml(three, { field: 'f' });
  assert.equal(ok.ok, true);
  assert.equal((ok as { value: Record<string, string> }).value.b1, big);
  assert.throws(() => parseYaml(five, { field: 'f' }), {
    code: 'YAML_TOO_COMPLEX',
    field: 'f',
    kind: 'terminal',
    message: new RegExp(`more than ${4 * five.length} bytes`),
  });
});

const vmi = (annotation: string): VmiObject => ({
  metadata: {
    name: 'vm',
    namespace: 'ns',
    uid: '2c1a4f4e-5b1e-4f4b-8f0e-0c6b7f3c2a11',
    annotations: { [ANNOTATION]: annotation },
  },
  spec: {},
});

test('the seed budget: user-data, vendor-data and meta-data together', async () => {
  const opts = { ...DEFAULT_RENDER_OPTIONS, maxUserDataBytes: 1000, maxNetworkDataBytes: 100 };
  const ud = `#cloud-config\n#${'u'.repeat(900)}`;
  const vd = `#cloud-config\n#${'v'.repeat(900)}`;
  const ok = await renderSeed(vmi(JSON.stringify({ userData: ud })), new MemoryResolver(), opts);
  assert.equal(ok.kind, 'seed');
  await assert.rejects(
    renderSeed(
      vmi(JSON.stringify({ userData: ud, vendorData: vd, metaData: { note: 'm'.repeat(300) } })),
      new MemoryResolver(),
      opts,
    ),
    { code: 'SEED_TOO_LARGE', kind: 'terminal', field: `${ANNOTATION}.metaData` },
  );
});

test('files[]: the user-data budget refuses before the base64 of every entry is made', async () => {
  const secret = { metadata: { name: 's', namespace: 'ns' }, data: { k: Buffer.alloc(600).toString('base64') } };
  const files = Array.from({ length: 5 }, (_, i) => ({
    from: { kind: 'secret', name: 's', key: 'k' },
    path: `/f${i}`,
  }));
  const opts = { ...DEFAULT_RENDER_OPTIONS, maxUserDataBytes: 2000 };
  await assert.rejects(renderSeed(vmi(JSON.stringify({ files })), new MemoryResolver({ secrets: [secret] }), opts), {
    code: 'USERDATA_TOO_LARGE',
    field: `${ANNOTATION}.files[2]`,
  });
});

test('checkYaml (events only) and parseYaml (objects) agree on validity and on the top-level kind', async () => {
  const { checkYaml } = await import('../../src/cloudinit/yaml.ts');
  const { loadAll } = await import('js-yaml');
  const piece = fc.constantFrom(
    'a: 1',
    'b: &x [1, 2]',
    'c: *x',
    'd: *nope',
    '- 1',
    '- &y {k: v}',
    '- *y',
    'e: !!binary aGk=',
    'f: !!int x',
    'g: !custom 1',
    '"q": "v"',
    'h: [1, *x]',
    'i: |\n  text',
    '---',
    '',
    '# c',
    'j: {a: 1, a: 2}',
    'k: &z',
    '  nested: 1',
    ': bad',
    '[1, 2',
    'l: &r [*r]',
  );
  fc.assert(
    fc.property(fc.array(piece, { maxLength: 6 }), (parts) => {
      const text = parts.join('\n');
      let checked: ReturnType<typeof checkYaml>;
      try {
        checked = checkYaml(text);
      } catch (e) {
        // Refused as too complex: only the recursive alias is that here.
        assert.equal((e as { code?: string }).code, 'YAML_TOO_COMPLEX');
        assert.match(text, /&r \[\*r\]/, JSON.stringify(text));
        return;
      }
      let parsed: { ok: boolean; top?: string };
      try {
        const docs = loadAll(text, { json: true });
        const v = docs[0];
        parsed =
          docs.length > 1
            ? { ok: false }
            : {
                ok: true,
                top:
                  docs.length === 0 || v === null
                    ? 'null'
                    : Array.isArray(v)
                      ? 'sequence'
                      : typeof v === 'object'
                        ? 'mapping'
                        : 'scalar',
              };
      } catch {
        parsed = { ok: false };
      }
      // The event check may refuse more (a recursive alias, too many aliases), never less.
      if (checked.ok) {
        assert.ok(parsed.ok, `checkYaml accepted what js-yaml refuses: ${JSON.stringify(text)}`);
        const top = checked.value.top;
        if (top === 'mapping' || top === 'sequence') assert.equal(parsed.top, top, JSON.stringify(text));
        else assert.ok(parsed.top === 'scalar' || parsed.top === 'null', JSON.stringify(text));
      } else {
        assert.ok(!parsed.ok, `checkYaml refused valid YAML: ${JSON.stringify(text)}`);
      }
    }),
    { numRuns: 3000 },
  );
});
