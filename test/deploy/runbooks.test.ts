// The alerts' runbooks (docs/runbooks/<AlertName>.md, one page per alert, as
// KubeVirt's runbooks are laid out) and the error-code reference
// (docs/reference/error-codes.md) against what the code and the rules say.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize } from 'node:path';
import { ERROR_CODES } from '../../src/errors.ts';
import { WAITING } from '../../src/agent/waiting.ts';
import { ROOT, loadYamlDocuments } from '../support/manifests.ts';
import type { RuleGroupFile } from '../support/promql.ts';

const CODES = new Set<string>(ERROR_CODES);
const RUNBOOKS = 'docs/runbooks';
const REFERENCE = 'docs/reference/error-codes.md';

const [rule] = loadYamlDocuments('manifests/monitoring/prometheusrule.yaml') as unknown as { spec: RuleGroupFile }[];
const alertNames = rule.spec.groups.flatMap((g) => g.rules.map((r) => String(r.alert))).sort();
const pages = readdirSync(ROOT + RUNBOOKS)
  .filter((f) => f.endsWith('.md'))
  .sort();
const read = (file: string) => readFileSync(ROOT + file, 'utf8');

// Upper-case words with an underscore that are not error codes.
const NOT_CODES = new Set(['NET_ADMIN', 'O_NOFOLLOW', 'O_NONBLOCK']);

// The error codes a text names: `CODE` and `PREFIX_*` in backticks, and
// bare CODE words (in code blocks too: jq filters, PromQL matchers).
function namedCodes(text: string): { codes: string[]; patterns: string[] } {
  const patterns = [...text.matchAll(/`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_)\*`/g)].map((m) => m[1]);
  const codes = [...text.matchAll(/(?<![A-Za-z0-9_.$-])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?![A-Za-z0-9_*])/g)]
    .map((m) => m[1])
    .filter((w) => !NOT_CODES.has(w));
  return { codes: [...new Set(codes)], patterns: [...new Set(patterns)] };
}

test('the code finder sees codes and prefixes and skips what is not a code', () => {
  const found = namedCodes(
    'A `LIBVIRT_*` code, `SEED_GATE_WAITING`, code="DOMAIN_NOT_FOUND", NET_ADMIN, $HOST_IP, vmseed_vmi_info, `Paused`.',
  );
  assert.deepEqual(found.patterns, ['LIBVIRT_']);
  assert.deepEqual(found.codes.sort(), ['DOMAIN_NOT_FOUND', 'SEED_GATE_WAITING']);
});

test('every alert has its runbook page, and every page an alert', () => {
  assert.deepEqual(
    pages,
    alertNames.map((a) => `${a}.md`),
  );
});

test("each runbook is laid out as KubeVirt's: title, then Meaning, Impact, Diagnosis, Mitigation", () => {
  for (const page of pages) {
    const text = read(`${RUNBOOKS}/${page}`);
    const headings = [...text.matchAll(/^(#{1,2}) (.+)$/gm)].map((m) => `${m[1]} ${m[2].trim()}`);
    assert.deepEqual(
      headings,
      [`# ${page.replace(/\.md$/, '')}`, '## Meaning', '## Impact', '## Diagnosis', '## Mitigation'],
      page,
    );
    // Diagnosis gives something to run.
    const diagnosis = text.slice(text.indexOf('## Diagnosis'), text.indexOf('## Mitigation'));
    assert.match(diagnosis, /```(bash|promql)\n/, `${page}: Diagnosis has no command or query`);
  }
});

test('every error code a runbook names exists, and every code prefix matches one', () => {
  for (const page of pages) {
    const { codes, patterns } = namedCodes(read(`${RUNBOOKS}/${page}`));
    for (const code of codes) assert.ok(CODES.has(code), `${page}: ${code} is not in ERROR_CODES`);
    for (const prefix of patterns)
      assert.ok(
        ERROR_CODES.some((c) => c.startsWith(prefix)),
        `${page}: no code starts with ${prefix}`,
      );
  }
});

// The default libvirt client is --libvirt rpc, which emits LIBVIRT_*;
// VIRSH_* come only with --libvirt virsh.
test("a runbook naming a VIRSH_* code names the default path's LIBVIRT_* codes and says --libvirt virsh", () => {
  for (const file of [...pages.map((p) => `${RUNBOOKS}/${p}`), 'docs/operations.md']) {
    const text = read(file);
    if (!/\bVIRSH_[A-Z_]*/.test(text)) continue;
    assert.match(text, /\bLIBVIRT_[A-Z_]+/, `${file}: names VIRSH_* without LIBVIRT_*`);
    assert.match(text, /--libvirt virsh/, `${file}: does not say VIRSH_* is --libvirt virsh`);
  }
});

test("the runbooks' relative links lead to files that exist", () => {
  for (const page of pages) {
    const text = read(`${RUNBOOKS}/${page}`);
    for (const [, target] of text.matchAll(/\]\(([^)#\s]+\.md)(?:#[^)]*)?\)/g)) {
      if (/^[a-z]+:/.test(target)) continue;
      const file = normalize(join(dirname(`${RUNBOOKS}/${page}`), target));
      assert.ok(existsSync(ROOT + file), `${page}: link to ${target} (${file}) leads nowhere`);
    }
  }
});

test('docs/operations.md lists every alert with a link to its page', () => {
  const docs = read('docs/operations.md');
  const start = docs.indexOf('### Alerts');
  assert.ok(start >= 0);
  const end = docs.indexOf('\n## ', start);
  const section = docs.slice(start, end < 0 ? undefined : end);
  const linked = [...section.matchAll(/\]\(runbooks\/(Vmseed\w+)\.md\)/g)].map((m) => m[1]).sort();
  assert.deepEqual(linked, alertNames);
  assert.doesNotMatch(section, /^#### Alert: /m, 'the runbook text lives in docs/runbooks/');
});

// ---- the error-code reference ----

const RETRIED = new Set(['waits', 'yes', 'no', 'yes / no', 'no / warning', 'warning', 'startup']);

function referenceRows(): { code: string; meaning: string; retried: string; fix: string }[] {
  return [...read(REFERENCE).matchAll(/^\| `([A-Z0-9_]+)` \| (.+?) \| (.+?) \| (.+?) \|$/gm)].map((m) => ({
    code: m[1],
    meaning: m[2],
    retried: m[3],
    fix: m[4],
  }));
}

test('the error-code reference lists exactly ERROR_CODES, each once, in its order', () => {
  const rows = referenceRows();
  assert.deepEqual(
    rows.map((r) => r.code),
    [...ERROR_CODES],
  );
  // Every table row of the file was read (none with an unexpected form).
  const tableRows = read(REFERENCE)
    .split('\n')
    .filter((l) => l.startsWith('| `'));
  assert.equal(tableRows.length, rows.length);
});

test('each code says what it means, whether it is retried, and the fix', () => {
  for (const r of referenceRows()) {
    assert.ok(RETRIED.has(r.retried), `${r.code}: retried is "${r.retried}"`);
    assert.ok(r.meaning.length > 15, `${r.code}: meaning`);
    assert.ok(r.fix.length > 5, `${r.code}: fix`);
  }
});

test("the codes the reference says a VMI waits on are the agent's waiting codes (src/agent/waiting.ts)", () => {
  const waits = referenceRows()
    .filter((r) => r.retried === 'waits')
    .map((r) => r.code)
    .sort();
  assert.deepEqual(waits, [...WAITING].sort());
});

test("the error-code reference's links lead to files that exist", () => {
  for (const [, target] of read(REFERENCE).matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)) {
    const file = normalize(join(dirname(REFERENCE), target));
    assert.ok(existsSync(ROOT + file), `link to ${target} (${file}) leads nowhere`);
  }
});
