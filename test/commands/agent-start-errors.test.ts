// What an operator meets first: a wrong --local directory is one line and
// exit 2 before anything listens; a port in use is one line naming the
// flag it came from, once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runCli } from '../support/cli.ts';

function plainLines(err: string): string[] {
  // stderr also carries the agent's JSON log; the errors are its plain lines.
  return err
    .trim()
    .split('\n')
    .filter((l) => l !== '' && !l.startsWith('{'));
}

test('--local with a missing directory or a file: one line, exit 2, no listener opened, nothing logged', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-local-missing-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'file.yaml'), 'x: 1\n');
  for (const [arg, why] of [
    ['/nonexistent', /--local \/nonexistent: ENOENT; give an existing directory of YAML manifests$/],
    ['file.yaml', /--local .*file\.yaml: not a directory; give the directory of YAML manifests to run on$/],
  ] as const) {
    const r = await runCli(
      ['agent', '--local', arg, '--state-dir', join(dir, 'seeds'), '--listen', '127.0.0.1:0'],
      dir,
    );
    assert.equal(r.code, 2, arg);
    assert.deepEqual(plainLines(r.err).length, 1, r.err);
    assert.match(r.err.trim(), why);
    assert.doesNotMatch(r.err, /listening|"level"/, 'before the logger or any listener');
  }
});

test('--listen on a port in use: "cannot listen on" said once, naming --listen, exit 1', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-listen-busy-'));
  const busy = createServer();
  await new Promise<void>((r) => busy.listen(0, '127.0.0.1', r));
  t.after(async () => {
    await new Promise((r) => busy.close(r));
    rmSync(dir, { recursive: true, force: true });
  });
  const port = (busy.address() as { port: number }).port;
  mkdirSync(join(dir, 'm'));
  const r = await runCli(
    ['agent', '--local', 'm', '--state-dir', join(dir, 'seeds'), '--listen', `127.0.0.1:${port}`],
    dir,
  );
  assert.equal(r.code, 1);
  const lines = plainLines(r.err);
  assert.equal(lines.length, 1, r.err);
  assert.equal(
    lines[0],
    `vmseed agent: cannot listen on 127.0.0.1:${port} (--listen): EADDRINUSE; choose another --listen address`,
  );
  assert.equal(lines[0].match(/cannot listen on/g)!.length, 1);
});
