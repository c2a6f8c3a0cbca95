// Which paths the libvirt socket walk follows: a symlink only where root
// alone could have put it, never as the socket itself, never in a directory
// a launcher (or anyone but root) can write.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer, createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { holdSocket } from '../../src/libvirt/rpc/socket-hold.ts';
import { VmseedError } from '../../src/errors.ts';
import { libvirtSocketCheck } from '../../src/commands/agent/readiness-checks.ts';
import { parseTemplate } from '../../src/libvirt/template.ts';

function code(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    return e instanceof VmseedError ? `vmseed:${e.code}` : (e as { code?: string }).code;
  }
  return undefined;
}

test('the held socket is the inode that was checked, whatever its name points to later', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vs-hold-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const sock = join(dir, 's');
  const server = createServer((c) => c.end('mine'));
  await new Promise<void>((r) => server.listen(sock, r));
  t.after(() => server.close());
  const held = holdSocket(sock);
  try {
    rmSync(sock);
    symlinkSync('/nonexistent', sock);
    const got = await new Promise<string>((resolve, reject) => {
      const c = createConnection({ path: held.path });
      let text = '';
      c.on('data', (b) => (text += String(b)));
      c.on('end', () => resolve(text));
      c.on('error', reject);
    });
    assert.equal(got, 'mine');
  } finally {
    held.close();
  }
});

test('refused: the socket as a symlink, a file, a symlinked directory others can write; followed: a link in a root-only directory', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vs-hold-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  chmodSync(dir, 0o755);
  const real = join(dir, 'real');
  mkdirSync(real);
  const sock = join(real, 's');
  const server = createServer();
  await new Promise<void>((r) => server.listen(sock, r));
  t.after(() => server.close());
  symlinkSync(sock, join(dir, 'socklink'));
  writeFileSync(join(dir, 'file'), '');
  symlinkSync(real, join(dir, 'dirlink'));
  assert.equal(
    code(() => holdSocket(join(dir, 'socklink'))),
    'vmseed:LIBVIRT_ACCESS_DENIED',
  );
  assert.equal(
    code(() => holdSocket(join(dir, 'file'))),
    'vmseed:LIBVIRT_ACCESS_DENIED',
  );
  assert.equal(
    code(() => holdSocket(join(dir, 'missing'))),
    'ENOENT',
  );
  assert.equal(
    code(() => holdSocket(join(dir, 'file', 's'))),
    'ENOTDIR',
  );
  if (process.getuid?.() === 0) {
    // Root's 0755 directory: only root could have made the link.
    const held = holdSocket(join(dir, 'dirlink', 's'));
    held.close();
  }
  // The launcher's emptyDir is 2777: a link there is the launcher's.
  chmodSync(dir, 0o2777);
  assert.equal(
    code(() => holdSocket(join(dir, 'dirlink', 's'))),
    'vmseed:LIBVIRT_ACCESS_DENIED',
  );
  // `..` out of a directory others can write (it may have been moved).
  chmodSync(real, 0o777);
  assert.equal(
    code(() => holdSocket(`${real}/../real/s`)),
    'vmseed:LIBVIRT_ACCESS_DENIED',
  );
  holdSocket(sock).close();
  // A link in a root-only directory whose target passes through one others
  // can write: the walk continues with the target's components.
  if (process.getuid?.() === 0) {
    const outer = mkdtempSync(join(tmpdir(), 'vs-hold-'));
    t.after(() => rmSync(outer, { recursive: true, force: true }));
    chmodSync(outer, 0o755);
    symlinkSync(join(dir, 'dirlink'), join(outer, 'via'));
    assert.equal(
      code(() => holdSocket(join(outer, 'via', 's'))),
      'vmseed:LIBVIRT_ACCESS_DENIED',
    );
  }
});

test("the readiness check agrees with the walk: a symlink as the URI's socket is not ready, the socket itself is", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vs-hold-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const sock = join(dir, 's');
  const server = createServer();
  await new Promise<void>((r) => server.listen(sock, r));
  t.after(() => server.close());
  symlinkSync(sock, join(dir, 'link'));
  const check = (path: string) => libvirtSocketCheck(parseTemplate('uri', `qemu+unix:///session?socket=${path}`))!();
  assert.equal(await check(sock), undefined);
  assert.match((await check(join(dir, 'link'))) ?? '', /\/link is a symlink, not a unix socket; refusing to connect/);
});

test('the readiness check walks the directories above the socket as a dial does: a symlinked directory in a launcher-writable one is not ready', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vs-hold-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const real = join(dir, 'real');
  mkdirSync(real);
  const server = createServer();
  await new Promise<void>((r) => server.listen(join(real, 's'), r));
  t.after(() => server.close());
  symlinkSync(real, join(dir, 'alias'));
  const check = (path: string) => libvirtSocketCheck(parseTemplate('uri', `qemu+unix:///session?socket=${path}`))!();
  // As a launcher's emptyDir (2777): whoever can write it may have put the link.
  chmodSync(dir, 0o2777);
  assert.equal(await check(join(real, 's')), undefined);
  assert.equal(
    code(() => holdSocket(join(dir, 'alias', 's'))),
    'vmseed:LIBVIRT_ACCESS_DENIED',
  );
  assert.match(
    (await check(join(dir, 'alias', 's'))) ?? '',
    /^libvirt socket for .*: .*alias\/s passes through a symlink \(alias\) in a directory others than root can write/,
  );
});

test('the per-launcher readiness check walks to the directory above the sockets the same way: no symlink a launcher could have planted', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'vs-hold-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const pods = join(dir, 'pods');
  mkdirSync(join(pods, 'x'), { recursive: true });
  symlinkSync(pods, join(dir, 'alias'));
  const check = (podsDir: string) =>
    libvirtSocketCheck(parseTemplate('uri', `qemu+unix:///session?socket=${podsDir}/{podUID}/virtqemud-sock`))!();
  chmodSync(dir, 0o2777);
  assert.equal(await check(pods), undefined);
  assert.match(
    (await check(join(dir, 'alias', 'x'))) ?? '',
    /alias\/x, where the per-VM libvirt sockets are \(--libvirt-uri\): .* passes through a symlink \(alias\)/,
  );
  assert.match(
    (await check(join(dir, 'alias'))) ?? '',
    /alias, where the per-VM libvirt sockets are \(--libvirt-uri\): .*alias is a symlink, not a directory/,
  );
  writeFileSync(join(dir, 'file'), '');
  assert.match(
    (await check(join(dir, 'file'))) ?? '',
    /file, where the per-VM libvirt sockets are .* is not a directory/,
  );
  assert.match((await check(join(dir, 'missing'))) ?? '', /missing, where .* does not exist/);
});
