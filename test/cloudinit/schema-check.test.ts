// checkSchemas beyond agreement with cloud-init: what it says it could not
// check, what it never quotes, and how it bounds hostile input.
import '../support/schema-files.ts';
import assert from 'node:assert/strict';
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, test } from 'node:test';
import { reportWarnings } from '../../src/cloudinit/schema/seed-warnings.ts';
import { checkSchemas, MAX_PROBLEMS, MAX_SCHEMA_BRANCHES, MAX_SCHEMA_NODES } from '../../src/cloudinit/schema/check.ts';
import { compileCloudInitSchema } from '../../src/cloudinit/schema/ci-validator.ts';
import {
  DEFAULT_CLOUD_INIT_RELEASE,
  DEFAULT_SCHEMA_DIR,
  SchemaStore,
} from '../../src/cloudinit/schema/schema-store.ts';
import { parseYaml } from '../../src/cloudinit/yaml.ts';

const enc = (s: string): Uint8Array => new TextEncoder().encode(s);
const dir = DEFAULT_SCHEMA_DIR;
const here = path.dirname(new URL(import.meta.url).pathname);

function mime(parts: { type: string; body: string; filename?: string; b64?: boolean }[]): string {
  const b = '==BOUNDARY==';
  let s = `Content-Type: multipart/mixed; boundary="${b}"\nMIME-Version: 1.0\n\n`;
  for (const p of parts) {
    s += `--${b}\nContent-Type: ${p.type}; charset="us-ascii"\n`;
    if (p.filename) s += `Content-Disposition: attachment; filename="${p.filename}"\n`;
    if (p.b64) s += 'Content-Transfer-Encoding: base64\n';
    s += `\n${p.b64 ? Buffer.from(p.body).toString('base64') : p.body}\n`;
  }
  return `${s}--${b}--\n`;
}

describe('checkSchemas', { timeout: 60_000 }, () => {
  test('a MIME message: each cloud-config part checked and located; what is not checked is said, with why', () => {
    const r = checkSchemas({
      dir,
      release: '25.1',
      reveal: false,
      userData: enc(
        mime([
          { type: 'text/cloud-config', body: '#cloud-config\nruncmd: [ls]\n', filename: 'ok.yaml' },
          { type: 'text/cloud-config', body: '#cloud-config\nruncmd: "echo hi"\n', filename: 'bad.yaml', b64: true },
          { type: 'text/jinja2', body: '## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\n' },
          { type: 'text/x-include-url', body: 'https://example.com/more.yaml\n' },
          { type: 'text/x-shellscript', body: '#!/bin/sh\necho hi\n' },
          { type: 'text/plain', body: '#cloud-config\npackages: {nginx: latest}\n' },
        ]),
      ),
    });
    assert.deepEqual(
      r.problems.map((p) => [p.part, p.path, p.module]),
      [
        ['part 2 (bad.yaml)', 'runcmd', 'cc_runcmd'],
        ['part 6', 'packages', 'cc_package_update_upgrade_install'],
      ],
    );
    assert.deepEqual(
      r.unchecked.map((u) => [u.part, u.code]),
      [
        ['part 3', 'SCHEMA_TEMPLATE'],
        ['part 4', 'SCHEMA_UNCHECKED'],
      ],
    );
    assert.match(r.unchecked[0].reason, /jinja template is rendered in the guest/);
    assert.match(r.unchecked[1].reason, /fetches the URLs an #include names/);
  });

  test('jinja and #include user-data are not checked, and say so; a script has nothing to check', () => {
    const jinja = checkSchemas({
      dir,
      release: '25.1',
      reveal: false,
      userData: enc('## template: jinja\n#cloud-config\nruncmd: "x"\n'),
    });
    assert.deepEqual(jinja.problems, []);
    assert.deepEqual(
      jinja.unchecked.map((u) => u.code),
      ['SCHEMA_TEMPLATE'],
    );
    // A template is normal (Cluster API's bootstrap data): no warning on the node; an #include is said.
    assert.deepEqual(reportWarnings(jinja), []);
    const include = checkSchemas({ dir, release: '25.1', reveal: false, userData: enc('#include\nhttps://x/y\n') });
    assert.deepEqual(
      reportWarnings(include).map((w) => w.code),
      ['CLOUDCONFIG_UNCHECKED'],
    );
    const script = checkSchemas({ dir, release: '25.1', reveal: false, userData: enc('#!/bin/sh\necho hi\n') });
    assert.deepEqual([script.problems, script.unchecked], [[], []]);
  });

  test('network-config: v1 and v2 against 25.1; 22.4 ships no network schema and says so', () => {
    const bad = enc('network:\n  version: 2\n  ethernets:\n    eth0:\n      dhcp4: maybe\n');
    const r = checkSchemas({ dir, release: '25.1', reveal: false, networkConfig: bad });
    assert.ok(r.problems.length > 0);
    assert.ok(r.problems.every((p) => p.module === 'network-config' && p.document === 'network-config'));
    const old = checkSchemas({ dir, release: '22.4', reveal: false, networkConfig: bad });
    assert.deepEqual(old.problems, []);
    assert.match(old.unchecked[0].reason, /22\.4 ships no network-config schema/);
  });

  test('vendor-data is checked as cloud-config and located as vendor-data', () => {
    const r = checkSchemas({ dir, release: '22.4', reveal: false, vendorData: enc('#cloud-config\nruncmd: "x"\n') });
    assert.deepEqual(
      r.problems.map((p) => [p.document, p.path]),
      [['vendor-data', 'runcmd']],
    );
  });

  test('reveal false: no value of any corpus document appears in any message', async () => {
    const corpus = path.join(here, '..', 'fixtures', 'cloud-config-corpus');
    // A message may quote the schema's own words (an enum's allowed values).
    const schemas = (
      await Promise.all(['22.4', '25.1'].map((r) => readFile(path.join(dir, r, 'schema-cloud-config-v1.json'), 'utf8')))
    ).join('');
    let messages = 0;
    for (const f of (await readdir(corpus)).filter((x) => x.endsWith('.yaml'))) {
      const text = await readFile(path.join(corpus, f), 'utf8');
      const parsed = parseYaml(text, { yaml11: true, allowDuplicateKeys: true });
      if (!parsed.ok) continue;
      const values: string[] = [];
      const walk = (v: unknown): void => {
        if (typeof v === 'string' && v.length >= 6 && !schemas.includes(v)) values.push(v.slice(0, 6));
        else if (Array.isArray(v)) v.forEach(walk);
        else if (v && typeof v === 'object') Object.values(v).forEach(walk);
      };
      walk(parsed.value);
      for (const release of ['22.4', '25.1'] as const) {
        const r = checkSchemas({ dir, release, reveal: false, userData: enc(text) });
        for (const p of r.problems.filter((x) => x.severity === 'error')) {
          messages++;
          for (const v of values)
            assert.ok(!p.message.includes(`'${v}`), `${f} ${release} ${p.path}: ${p.message} quotes ${v}`);
        }
      }
    }
    assert.ok(messages >= 40, `${messages} messages looked at`);
  });

  test('a password that fails a type check is named by its path only', () => {
    const secret = 'hunter2-TopSecret';
    for (const release of ['22.4', '25.1'] as const) {
      const r = checkSchemas({
        dir,
        release,
        reveal: false,
        userData: enc(`#cloud-config\nchpasswd:\n  users:\n    - {name: bob, password: [${secret}]}\n`),
      });
      assert.ok(r.problems.length > 0, release);
      assert.ok(!JSON.stringify(r).includes(secret), release);
    }
  });

  test('bad input stays within the budget: deep nesting, huge arrays, many alternatives', () => {
    // Deep: YAML's own depth bound stops it before the schema walk.
    const deep = `#cloud-config\nruncmd: ${'['.repeat(200)}${']'.repeat(200)}\n`;
    const d = checkSchemas({ dir, release: '25.1', reveal: false, userData: enc(deep) });
    assert.equal(d.problems.length, 0);
    assert.equal(d.unchecked[0].code, 'SCHEMA_BUDGET_EXCEEDED');
    // Huge: more values than the walk takes.
    const huge = `#cloud-config\nruncmd: [${Array.from({ length: MAX_SCHEMA_NODES }, () => '1').join(',')}]\n`;
    const h = checkSchemas({ dir, release: '25.1', reveal: false, userData: enc(huge) });
    assert.deepEqual([h.problems.length, h.unchecked[0].code], [0, 'SCHEMA_BUDGET_EXCEEDED']);
    // Many alternatives: 5,000 users (under the node budget) each walks
    // the users anyOf/oneOf branches; the walk is cut by its branch budget.
    const users = Array.from({ length: 5_000 }, (_, i) => `  - {name: u${i}, sudo: [x], groups: 5}`).join('\n');
    const a = checkSchemas({ dir, release: '25.1', reveal: false, userData: enc(`#cloud-config\nusers:\n${users}\n`) });
    assert.equal(a.unchecked[0]?.code, 'SCHEMA_BUDGET_EXCEEDED');
    assert.match(a.unchecked[0].reason, /alternatives/);
  });

  test('problems are capped; the rest are counted', () => {
    const many = Array.from({ length: 80 }, (_, i) => `  - {path: /f${i}, contents: x}`).join('\n');
    const r = checkSchemas({
      dir,
      release: '25.1',
      reveal: false,
      userData: enc(`#cloud-config\nwrite_files:\n${many}\n`),
    });
    assert.equal(r.problems.length, 50);
    assert.equal(r.omitted, 30);
  });

  test('YAML 1.1 as cloud-init reads it: yes is a boolean, 0644 an integer, !!binary a string', () => {
    const r = checkSchemas({
      dir,
      release: '25.1',
      reveal: true,
      userData: enc(
        '#cloud-config\npackage_update: yes\nssh_pwauth: on\nwrite_files:\n  - {path: /a, permissions: 0644, content: !!binary aGk=}\n',
      ),
    });
    assert.deepEqual(
      r.problems.map((p) => [p.severity, p.path]),
      [['error', 'write_files.0.permissions']],
    );
    assert.match(r.problems[0].message, /^420 is not of type 'string'$/);
  });
});

describe('schema files missing or unreadable', { timeout: 30_000 }, () => {
  test('a missing directory: every release off with the reason; checks say not checked, never throw', async () => {
    const store = new SchemaStore('/nonexistent/vmseed-schemas');
    for (const s of store.status()) {
      assert.equal(s.state, 'off');
      assert.match(
        s.state === 'off' ? s.reason : '',
        /release\.json is missing; run scripts\/fetch-cloud-init-schemas\.sh/,
      );
    }
    const r = checkSchemas({
      dir: '/nonexistent/vmseed-schemas',
      release: '25.1',
      reveal: false,
      userData: enc('#cloud-config\nruncmd: x\n'),
    });
    assert.deepEqual(r.problems, []);
    assert.match(r.unchecked[0].reason, /schema-cloud-config-v1\.json is missing/);
  });

  test('a corrupt or unreadable schema file: off for that release, with the reason', async () => {
    const d = await mkdtemp(path.join(tmpdir(), 'vmseed-schemas-'));
    try {
      await mkdir(path.join(d, '25.1'));
      await writeFile(
        path.join(d, '25.1', 'release.json'),
        JSON.stringify({ version: 'x', files: ['schema-cloud-config-v1.json'] }),
      );
      await writeFile(path.join(d, '25.1', 'schema-cloud-config-v1.json'), '{ not json');
      const r = checkSchemas({ dir: d, release: '25.1', reveal: false, userData: enc('#cloud-config\nruncmd: x\n') });
      assert.match(r.unchecked[0].reason, /not valid JSON/);
      await mkdir(path.join(d, '22.4'));
      await writeFile(path.join(d, '22.4', 'release.json'), '{}');
      await chmod(path.join(d, '22.4', 'release.json'), 0o000);
      const s = new SchemaStore(d).status();
      assert.equal(s.find((x) => x.release === '25.1')?.state, 'ready');
      // Root reads a 0000 file anyway; either way the release is off with a reason.
      const old = s.find((x) => x.release === '22.4');
      assert.equal(old?.state, 'off');
    } finally {
      await rm(d, { recursive: true, force: true });
    }
  });

  test('a schema compiles once per store: the second validator is the first', () => {
    const store = new SchemaStore(dir);
    const a = store.validator('22.4', 'cloud-config');
    const b = store.validator('22.4', 'cloud-config');
    assert.ok(a.ok && b.ok && a.validator === b.validator);
  });
});

describe('cloud-init validator semantics on a small schema', () => {
  const schema = {
    $defs: {
      a: { type: 'object', properties: { k: { type: 'string', deprecated: true, description: 'old' } } },
    },
    properties: {
      x: { anyOf: [{ type: 'integer' }, { $ref: '#/$defs/a' }] },
      y: { oneOf: [{ type: 'string' }, { type: 'string', minLength: 1 }] },
    },
  };
  test('a deprecation counts only from the branch that matched', () => {
    const v = compileCloudInitSchema(schema, '22.4');
    assert.deepEqual(
      v.validate({ x: { k: 's' } }, 100).deprecations.map((d) => [d.path, d.deprecation]),
      [[['x', 'k'], 'DEPRECATED: old']],
    );
    // k fails its type: the branch fails, its deprecation is dropped.
    const r = v.validate({ x: { k: 5 } }, 100);
    assert.deepEqual(r.deprecations, []);
    assert.deepEqual(
      r.errors.map((e) => [e.path, e.keyword]),
      [[['x'], 'anyOf']],
    );
  });
  test('oneOf valid under two branches is an error; the branch budget throws', () => {
    const v = compileCloudInitSchema(schema, '25.1');
    assert.deepEqual(
      v.validate({ y: 'ab' }, 100).errors.map((e) => [e.path, e.keyword]),
      [[['y'], 'oneOf']],
    );
    assert.throws(() => v.validate({ y: 'ab' }, 1), /too many anyOf\/oneOf branches/);
  });
});

test('docs/cloud-config-validation.md states the bounds and defaults of the code', async () => {
  const doc = (await readFile(path.join(here, '..', '..', 'docs', 'cloud-config-validation.md'), 'utf8')).replace(
    /\s+/g,
    ' ',
  );
  for (const phrase of [
    `more than ${MAX_SCHEMA_NODES.toLocaleString('en-US')} YAML nodes`,
    `more than ${MAX_SCHEMA_BRANCHES.toLocaleString('en-US')} alternatives`,
    `At most ${MAX_PROBLEMS} problems are kept`,
    `(default \`${DEFAULT_CLOUD_INIT_RELEASE}\`)`,
    `default \`${DEFAULT_SCHEMA_DIR}\``,
    'cut at 80 characters',
  ])
    assert.ok(doc.includes(phrase), phrase);
});
