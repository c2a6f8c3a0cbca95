// Harness test: the reporter that npm test runs beside spec must fail the run
// on a skipped, todo or cancelled test, which node --test alone passes.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import test from 'node:test';

const ROOT = new URL('../../', import.meta.url);
const FIXTURES = 'test/fixtures/strict-runner/';
const scripts = (JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8')) as { scripts: Record<string, string> })
  .scripts;

// The flags of the `node --test` command in an npm script, without its globs.
function runnerFlags(script: string): string[] {
  const command = script
    .split('&&')
    .map((s) => s.trim())
    .find((s) => s.startsWith('node --test'));
  assert.ok(command, `no node --test command in: ${script}`);
  return command.split(/\s+/).filter((a) => a.startsWith('--'));
}

async function run(flags: string[], file: string): Promise<{ code: number | null; out: string; err: string }> {
  const child = spawn(process.execPath, [...flags, FIXTURES + file], {
    cwd: ROOT,
    // Without NODE_TEST_CONTEXT, or the child takes itself for a file of this
    // run and runs nothing.
    env: Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== 'NODE_TEST_CONTEXT')),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr.on('data', (b: Buffer) => (err += b.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
  return { code, out, err };
}

const flags = runnerFlags(scripts.test);

test('harness: every test script runs the strict reporter beside spec, with the same flags', () => {
  assert.ok(flags.includes('--test-reporter=./test/support/strict-reporter.ts'), scripts.test);
  assert.ok(flags.includes('--test-reporter=spec'), 'the readable output stays');
  for (const name of ['test:unit', 'test:e2e']) {
    const other = runnerFlags(scripts[name]);
    for (const f of flags.filter((a) => a.startsWith('--test-reporter')))
      assert.ok(other.includes(f), `${name} lacks ${f}`);
  }
});

test('harness: npm test passes a file whose tests all pass', { timeout: 60_000 }, async () => {
  const r = await run(flags, 'passing.fixture.ts');
  assert.equal(r.code, 0, r.out + r.err);
  assert.match(r.out, /pass 1/, 'spec output is still printed');
});

for (const [file, kind, name] of [
  ['skipped.fixture.ts', 'skipped', 'stands aside for a missing tool'],
  ['skipped-at-runtime.fixture.ts', 'skipped', 'skips itself'],
  ['todo.fixture.ts', 'todo', 'a placeholder that fails without failing the run'],
  ['cancelled.fixture.ts', 'cancelled', 'never settles'],
]) {
  test(`harness: npm test fails a run with a ${kind} test (${file}) and names it`, { timeout: 60_000 }, async () => {
    const r = await run(flags, file);
    assert.equal(r.code, 1, r.out + r.err);
    assert.ok(r.err.includes(`${kind}: ${name}`), r.err);
  });
}

test(
  'harness: without the strict reporter node --test passes a skipped and a todo test',
  { timeout: 60_000 },
  async () => {
    // The control: what the reporter adds is the failure, not node itself.
    const bare = flags.filter((a) => !a.startsWith('--test-reporter'));
    for (const file of ['skipped.fixture.ts', 'todo.fixture.ts']) assert.equal((await run(bare, file)).code, 0, file);
  },
);
