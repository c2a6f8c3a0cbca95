// The node's own datasource key, made by the agent (--datasource-key-create):
// a missing key file is created once, mode 0640, with one fresh random key
// that parses as a datasource key; an existing file is never touched;
// creations racing each other (in one process or several) end with one
// key, the same for all, and no temporary file left; the agent logs that it
// created the file, never the key.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pino from 'pino';
import { createKeyFileIfMissing, parseKeyFile } from '../../src/datasource/tokens.ts';
import { loadDatasourceKeys } from '../../src/commands/agent/datasource.ts';
import { isVmseedError } from '../../src/errors.ts';
import { keyLine, randomKey } from './datasource-fixtures.ts';
import { startCliAgent } from '../support/agent-cli.ts';
import { waitFor } from '../support/agent-harness.ts';
import { CHALLENGE_PREFIX, challengeAnswer, newNonce } from '../../src/redirect/challenge.ts';

async function tempDir(t: { after(fn: () => Promise<void>): void }): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-key-create-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

test('a missing key file is created, mode 0640, with one valid random key', async (t) => {
  const dir = await tempDir(t);
  const path = join(dir, 'keys');
  assert.equal(await createKeyFileIfMissing(path), true);
  const st = await stat(path);
  assert.equal(st.mode & 0o777, 0o640);
  const text = await readFile(path, 'utf8');
  assert.match(text, /^[A-Za-z0-9+/]{43}=\n$/, 'one base64 line');
  assert.equal(parseKeyFile(text).length, 1);
  assert.equal(parseKeyFile(text)[0].length, 32);
  assert.deepEqual(await readdir(dir), ['keys'], 'no temporary file left');
  // Another directory, another key: never a fixed or derived one.
  const other = join(await tempDir(t), 'keys');
  await createKeyFileIfMissing(other);
  assert.notEqual(await readFile(other, 'utf8'), text);
});

test('an existing key file is left as it is', async (t) => {
  const dir = await tempDir(t);
  const path = join(dir, 'keys');
  const mine = `# rotated by hand\n${keyLine(randomKey())}\n${keyLine(randomKey())}\n`;
  await writeFile(path, mine, { mode: 0o640 });
  assert.equal(await createKeyFileIfMissing(path), false);
  assert.equal(await readFile(path, 'utf8'), mine);
  assert.equal((await stat(path)).mode & 0o777, 0o640);
  assert.deepEqual(await readdir(dir), ['keys']);
});

test('concurrent creations end with one key, the one every caller then reads', async (t) => {
  const dir = await tempDir(t);
  const path = join(dir, 'keys');
  const made = await Promise.all(Array.from({ length: 16 }, () => createKeyFileIfMissing(path)));
  assert.equal(made.filter((m) => m).length, 1, 'exactly one created it');
  const text = await readFile(path, 'utf8');
  assert.equal(parseKeyFile(text).length, 1);
  assert.deepEqual(await readdir(dir), ['keys']);

  // Several processes at once.
  const racing = join(dir, 'racing');
  const script = `import { createKeyFileIfMissing } from ${JSON.stringify(new URL('../../src/datasource/tokens.ts', import.meta.url).href)};
process.stdout.write(String(await createKeyFileIfMissing(${JSON.stringify(racing)})));`;
  const outs = await Promise.all(
    Array.from({ length: 4 }, () =>
      promisify(execFile)(process.execPath, ['--input-type=module', '-e', script]).then((r) => r.stdout),
    ),
  );
  assert.equal(outs.filter((o) => o === 'true').length, 1, outs.join(' '));
  assert.equal(parseKeyFile(await readFile(racing, 'utf8')).length, 1);
  assert.deepEqual((await readdir(dir)).sort(), ['keys', 'racing']);
});

test('a key file whose directory does not exist is an error naming the file; nothing is created', async (t) => {
  const dir = await tempDir(t);
  const path = join(dir, 'missing', 'keys');
  await assert.rejects(
    () => createKeyFileIfMissing(path),
    (e: unknown) =>
      isVmseedError(e) &&
      e.code === 'DATASOURCE_KEY_FILE_UNREADABLE' &&
      e.message.includes(path) &&
      e.message.includes('ENOENT'),
  );
  assert.deepEqual(await readdir(dir), []);
});

test('loadDatasourceKeys with create: the keyring holds the created key, and the log says only that it was created', async (t) => {
  const dir = await tempDir(t);
  const path = join(dir, 'keys');
  let log = '';
  const logger = pino({ level: 'debug' }, { write: (s: string) => void (log += s) });
  const { keyring, text } = await loadDatasourceKeys(path, logger, true);
  assert.equal(keyring.size, 1);
  assert.equal(text, await readFile(path, 'utf8'));
  assert.match(log, /datasource key file created/);
  assert.ok(!log.includes(text.trim()), 'the key is never logged');
  assert.ok(!log.includes(Buffer.from(text.trim(), 'base64').toString('base64url')), 'in no encoding');
  // Without create, a missing file stays missing: an empty keyring.
  const absent = join(dir, 'absent');
  const empty = await loadDatasourceKeys(absent, pino({ level: 'silent' }));
  assert.equal(empty.keyring.size, 0);
  await assert.rejects(() => stat(absent));
  // Again with create on an existing file: the same key, nothing logged as created.
  log = '';
  const again = await loadDatasourceKeys(path, logger, true);
  assert.equal(again.text, text);
  assert.doesNotMatch(log, /created/);
});

test('vmseed agent --datasource-key-create true: the key file is made at start and the datasource answers with its key', async (t) => {
  const dir = await tempDir(t);
  const path = join(dir, 'keys');
  await mkdir(join(dir, 'vmis'));
  const agent = startCliAgent([
    '--local',
    join(dir, 'vmis'),
    '--state-dir',
    join(dir, 'seeds'),
    '--datasource-listen',
    '127.0.0.1:0',
    '--datasource-key-file',
    path,
    '--datasource-key-create',
    'true',
  ]);
  t.after(() => agent.stop().then(() => undefined));
  await agent.url();
  const key = parseKeyFile(await readFile(path, 'utf8'));
  assert.equal(key.length, 1);
  assert.equal((await stat(path)).mode & 0o777, 0o640);
  // The redirect challenge is answered with this key: the datasource loaded it.
  const port = await waitFor('datasource port', () => /"port":(\d+),"prefix"/.exec(agent.output())?.[1]);
  const nonce = newNonce();
  const answer = await (await fetch(`http://127.0.0.1:${port}${CHALLENGE_PREFIX}${nonce}`)).text();
  assert.equal(answer.trim(), challengeAnswer(key[0], nonce));
  assert.equal(await agent.stop(), 0);
  assert.match(agent.output(), /datasource key file created/);
  assert.ok(!agent.output().includes(Buffer.from(key[0]).toString('base64')), 'the key is never logged');
});
