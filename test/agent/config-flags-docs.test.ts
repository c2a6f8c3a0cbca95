// The flag table (src/config/flags.ts) is what `vmseed agent --help` prints
// and what the flag tables of docs/reference/cli.md and docs/kubevirt.md
// document: every flag they name exists,
// with the defaults and environment variable the table gives it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { AGENT_USAGE } from '../../src/config/config.ts';
import { AGENT_FLAGS, docOf, envName, type FlagName, type FlagSpec } from '../../src/config/flags.ts';

const read = (file: string) => readFileSync(new URL(`../../${file}`, import.meta.url), 'utf8');
const FLAGS = Object.entries(AGENT_FLAGS) as Array<[FlagName, FlagSpec<unknown>]>;

function section(file: string, heading: string): string {
  const text = read(file);
  const start = text.indexOf(`\n${heading}\n`);
  assert.ok(start >= 0, `no section ${heading} in ${file}`);
  const rest = text.slice(start + heading.length + 2);
  const end = rest.search(/\n#{1,3} /);
  return end < 0 ? rest : rest.slice(0, end);
}

// `|` inside a cell is written `\|`.
function rows(text: string): string[][] {
  return text
    .split('\n')
    .filter((l) => l.startsWith('| `'))
    .map((l) =>
      l
        .slice(2, -2)
        .split(' | ')
        .map((c) => c.replaceAll('\\|', '|').replaceAll('`', '')),
    );
}

// What a documented default cell must say for the flag.
function documentedDefaults(spec: FlagSpec<unknown>): string[] {
  if (spec.byMode) return [docOf(spec.byMode.cluster), docOf(spec.byMode.local)];
  if (spec.byPlatform) return ['by --platform'];
  return spec.default !== undefined && spec.arg !== undefined ? [docOf(spec.default)] : [];
}

function helpOf(name: string): string {
  const lines = AGENT_USAGE.split('\n');
  const start = lines.findIndex((l) => l === `  --${name}` || l.startsWith(`  --${name} `));
  assert.ok(start >= 0, `--help lists --${name}`);
  const end = lines.findIndex((l, i) => i > start && !l.startsWith('    '));
  return lines.slice(start, end).join(' ');
}

test('--help lists every flag once, with its value and the environment variables not named VMSEED_<FLAG>', () => {
  for (const [name, spec] of FLAGS) {
    const heads = AGENT_USAGE.split('\n').filter((l) => new RegExp(`^  --${name}( |$)`).test(l));
    assert.equal(heads.length, 1, `--${name}`);
    if (spec.arg !== undefined) assert.ok(heads[0].startsWith(`  --${name} ${spec.arg} `), heads[0]);
    if (spec.env !== undefined) assert.match(helpOf(name), new RegExp(`env ${spec.env}`));
  }
  assert.match(AGENT_USAGE, /Every flag can also be set as VMSEED_<FLAG> in the environment/);
  assert.equal(envName('state-dir'), 'VMSEED_STATE_DIR');
  assert.equal(envName('node-name'), 'NODE_NAME');
  assert.equal(envName('kubeconfig'), 'KUBECONFIG');
});

test("every flag of docs/reference/cli.md's agent table is in the flag table, with its defaults", () => {
  const table = rows(section('docs/reference/cli.md', '## `vmseed agent`'));
  assert.ok(table.length >= 15, 'the agent table is found');
  // One row per flag: a flag in two rows would say two things.
  const rowFlags = table.flatMap(([names]) => [...names.matchAll(/--([a-z-]+)/g)].map((m) => m[1]));
  assert.deepEqual(
    rowFlags.filter((f, i) => rowFlags.indexOf(f) !== i),
    [],
    'flags listed twice',
  );
  for (const [names, defaults] of table) {
    const flags = [...names.matchAll(/--([a-z-]+)/g)].map((m) => m[1]);
    assert.ok(flags.length > 0, names);
    for (const env of names.match(/\b[A-Z]+_[A-Z_]+\b/g) ?? []) {
      assert.ok(
        flags.some((f) => f in AGENT_FLAGS && envName(f as FlagName) === env),
        `${env}: not the variable of ${names}`,
      );
    }
    for (const flag of flags) {
      assert.ok(flag in AGENT_FLAGS, `docs/reference/cli.md documents --${flag}, which the agent does not have`);
      for (const doc of documentedDefaults(AGENT_FLAGS[flag as FlagName]))
        assert.ok(defaults.includes(doc), `--${flag}: docs/reference/cli.md's '${defaults}' does not say ${doc}`);
    }
  }
});

test("docs/kubevirt.md's --platform table gives each preset's defaults", () => {
  const table = rows(section('docs/kubevirt.md', "## `--platform`: the libvirt side's defaults")).filter((r) =>
    r[0].startsWith('--'),
  );
  const byPlatform = FLAGS.filter(([, spec]) => spec.byPlatform).map(([name]) => name);
  assert.deepEqual(table.map((r) => r[0].slice(2)).sort(), [...byPlatform].sort());
  for (const [name, kubevirt, libvirt] of table) {
    const spec: FlagSpec<unknown> = AGENT_FLAGS[name.slice(2) as FlagName];
    assert.ok(kubevirt.includes(docOf(spec.byPlatform!.kubevirt)), `${name}, kubevirt: ${kubevirt}`);
    assert.ok(libvirt.includes(docOf(spec.byPlatform!.libvirt)), `${name}, libvirt: ${libvirt}`);
  }
});

// Prose elsewhere quotes defaults too ("`--max-network-data-bytes`, default
// 1 MiB", "`--image-path-in-domain` (default `{path}`"): each must be one of
// the flag's defaults as --help gives them.
test('every default that README.md and docs/ quote in prose for a flag is the flag table’s', () => {
  const docs = [
    'README.md',
    ...readdirSync(new URL('../../docs/', import.meta.url), { recursive: true, encoding: 'utf8' }).map(
      (f) => `docs/${f}`,
    ),
  ].filter((f) => f.endsWith('.md'));
  const value = String.raw`(\x60[^\x60]+\x60|[0-9][0-9.]* ?(?:[KMG]iB|ms|s|m|min)\b|[a-z][a-z0-9-]*)`;
  const quoted = new RegExp(
    String.raw`\x60--([a-z][a-z-]*)\x60(?:,| \(| is)? ?default(?:s to|:)? ${value}|\x60--([a-z][a-z-]*)\x60 \(${value} by default`,
    'g',
  );
  const allDefaults = (spec: FlagSpec<unknown>) =>
    [
      spec.default,
      spec.byMode?.cluster,
      spec.byMode?.local,
      spec.byPlatform?.kubevirt,
      spec.byPlatform?.libvirt,
    ].flatMap((d) => (d === undefined ? [] : [docOf(d), typeof d === 'string' ? d : undefined]));
  const said: string[] = [];
  for (const file of docs) {
    const text = readFileSync(new URL(`../../${file}`, import.meta.url), 'utf8').replace(/\s+/g, ' ');
    for (const m of text.matchAll(quoted)) {
      const name = (m[1] ?? m[3]) as FlagName;
      const quotedValue = (m[2] ?? m[4]).replaceAll('`', '');
      const spec = AGENT_FLAGS[name] as FlagSpec<unknown> | undefined;
      if (spec === undefined) continue; // another command's flag (build, redirect)
      said.push(`${file}: --${name} ${quotedValue}`);
      const defaults = allDefaults(spec).filter((d) => d !== undefined);
      assert.ok(
        defaults.some(
          (d) => d.replaceAll('`', '') === quotedValue || d.replace(/^the (.*) address$/, '$1') === quotedValue,
        ),
        `${file} says --${name} defaults to ${quotedValue}; the flag table says ${defaults.join(' / ')}`,
      );
    }
  }
  // The scan finds the ones there are (a regex that matches nothing passes
  // every document).
  assert.ok(said.length >= 6, said.join('\n'));
  assert.ok(said.includes('docs/kubevirt-differences.md: --max-network-data-bytes 1 MiB'), said.join('\n'));
});
