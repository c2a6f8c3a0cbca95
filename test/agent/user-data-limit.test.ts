// The default user-data limit is one number: the code's default, what
// `vmseed agent --help` says and what the docs say (docs/reference/cli.md's
// flag table, docs/vm-owners-guide.md's limits) agree.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { AGENT_USAGE, loadConfig } from '../../src/config/config.ts';
import { DEFAULT_MAX_NETWORK_DATA_BYTES, DEFAULT_MAX_USER_DATA_BYTES } from '../../src/cloudinit/limits.ts';
import { DEFAULT_RENDER_OPTIONS } from '../../src/cloudinit/render.ts';

const read = (file: string) => readFileSync(new URL(`../../${file}`, import.meta.url), 'utf8');
const CLI = read('docs/reference/cli.md');
const GUIDE = read('docs/vm-owners-guide.md');
const DOCS = ['README.md', 'docs/install.md', 'docs/kubevirt.md', 'docs/reference/annotation.md']
  .map(read)
  .concat(CLI, GUIDE);
const mib = (n: number) => `${n / 1024 / 1024} MiB`;

test('--max-user-data-bytes: code, --help and the docs agree on the default', () => {
  for (const c of [loadConfig(['--local', 'x'], {}, '/')!, loadConfig([], { NODE_NAME: 'n' }, '/')!]) {
    assert.equal(c.maxUserDataBytes, DEFAULT_MAX_USER_DATA_BYTES);
    assert.equal(c.maxNetworkDataBytes, DEFAULT_MAX_NETWORK_DATA_BYTES);
  }
  assert.equal(DEFAULT_RENDER_OPTIONS.maxUserDataBytes, DEFAULT_MAX_USER_DATA_BYTES);
  const help = AGENT_USAGE.split('\n').find((l) => l.includes('--max-user-data-bytes'));
  assert.ok(help, '--help lists --max-user-data-bytes');
  assert.match(help, new RegExp(`default ${DEFAULT_MAX_USER_DATA_BYTES}, ${mib(DEFAULT_MAX_USER_DATA_BYTES)}`));
  const flagRow = CLI.split('\n').find((l) => l.startsWith('| `--max-user-data-bytes`'));
  assert.ok(
    flagRow?.includes(`| ${mib(DEFAULT_MAX_USER_DATA_BYTES)}, ${mib(DEFAULT_MAX_NETWORK_DATA_BYTES)} |`),
    flagRow,
  );
  const limitsRow = GUIDE.split('\n').find((l) => l.startsWith('| user-data |'));
  assert.ok(limitsRow?.includes(`default ${mib(DEFAULT_MAX_USER_DATA_BYTES)}`), limitsRow);
  // Nowhere else a different figure for it.
  for (const line of DOCS.flatMap((d) => d.split('\n')).filter((l) => l.includes('max-user-data-bytes'))) {
    for (const m of line.matchAll(/(\d+) MiB by default|default (\d+) MiB/g))
      assert.equal(Number(m[1] ?? m[2]), DEFAULT_MAX_USER_DATA_BYTES / 2 ** 20, line);
  }
});

test('--max-user-data-bytes is honoured and bounded', () => {
  assert.equal(loadConfig(['--local', 'x', '--max-user-data-bytes', '4096'], {}, '/')!.maxUserDataBytes, 4096);
  assert.throws(() => loadConfig(['--local', 'x', '--max-user-data-bytes', '0'], {}, '/'), {
    name: 'ConfigError',
    // Names the flag and the range that fixes it.
    message: /^--max-user-data-bytes: 0 is out of range; use 1\.\.\d+$/,
  });
});
