// Where Cluster API bootstrap data writes its sentinel, from user-data laid
// out as CABPK writes it (test/fixtures/cabpk): last in runcmd, elsewhere
// (postKubeadmCommands after it, a script part, something unreadable), or
// not at all; bounded and never throwing on hostile input.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import {
  BOOTSTRAP_SENTINEL_PATH,
  bootstrapSentinel,
  quickBootstrapSentinel,
} from '../../../src/cloudinit/userdata/bootstrap-sentinel.ts';
import { DEFAULT_MAX_USER_DATA_BYTES } from '../../../src/cloudinit/limits.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../../src/cloudinit/render.ts';
import { MemoryResolver } from '../../../src/cloudinit/refs/memory-resolver.ts';
import { ANNOTATION } from '../../../src/cloudinit/annotation/annotation.ts';
import { runPure } from '../../../src/cloudinit/pure-ops.ts';

const fixture = (f: string) => readFileSync(new URL(`../../fixtures/cabpk/${f}`, import.meta.url), 'utf8');
const INIT = fixture('controlplane-init.yaml');
const JOIN_POST = fixture('node-join-post-commands.yaml');
const MAX = DEFAULT_MAX_USER_DATA_BYTES;
const bytes = (s: string | Buffer) => new Uint8Array(Buffer.from(s));
const where = (s: string | Buffer, max = MAX) => bootstrapSentinel(bytes(s), max);
const SENTINEL = `echo success > ${BOOTSTRAP_SENTINEL_PATH}`;

test("CABPK's control-plane init (## template: jinja, runcmd ending with kubeadm init && the sentinel): last", () => {
  assert.equal(where(INIT), 'last');
  // The same as plain #cloud-config, and gzipped.
  assert.equal(where(INIT.replace('## template: jinja\n', '')), 'last');
  assert.equal(where(gzipSync(Buffer.from(INIT))), 'last');
  // As cloud-init reads YAML 1.1 and PyYAML lets a later duplicate key win.
  assert.equal(where(`${INIT}\nruncmd:\n  - kubeadm init && ${SENTINEL}\n`), 'last');
  assert.equal(where(`${INIT}\nruncmd:\n  - kubeadm init && ${SENTINEL}\n  - reboot\n`), 'elsewhere');
});

test('a join whose postKubeadmCommands follow the sentinel: elsewhere', () => {
  assert.equal(where(JOIN_POST), 'elsewhere');
  // Without them, the same join is last.
  const join = JOIN_POST.replace(
    /\n {2}- "systemctl restart kubelet"\n {2}- "echo joined > \/var\/log\/joined"\n$/,
    '\n',
  );
  assert.notEqual(join, JOIN_POST);
  assert.equal(where(join), 'last');
});

test('only a write that follows from the command before it, as the very last command, is last', () => {
  const doc = (entry: string) => `#cloud-config\nruncmd:\n  - ${entry}\n`;
  assert.equal(where(doc(`'kubeadm init; ${SENTINEL};'`)), 'last');
  assert.equal(where(doc(`'${SENTINEL}'`)), 'last');
  assert.equal(where(doc(`'kubeadm init || ${SENTINEL}'`)), 'elsewhere');
  assert.equal(where(doc(`'kubeadm init && ${SENTINEL} && reboot'`)), 'elsewhere');
  assert.equal(where(doc(`'if kubeadm init; then ${SENTINEL}; fi'`)), 'elsewhere');
  assert.equal(where(doc(`'kubeadm init & ${SENTINEL}'`)), 'elsewhere');
  // A list is argv, quoted word by word: only a shell's -c script redirects.
  assert.equal(where(doc(`[sh, -c, 'kubeadm init && ${SENTINEL}']`)), 'last');
  assert.equal(where(doc(`[/bin/bash, -c, 'kubeadm init && ${SENTINEL}']`)), 'last');
  assert.equal(where(doc(`[echo, success, '>', ${BOOTSTRAP_SENTINEL_PATH}]`)), 'elsewhere');
  // A path named but written by something else, or runcmd not a list.
  assert.equal(where(`#cloud-config\nbootcmd:\n  - ${SENTINEL}\n`), 'elsewhere');
  assert.equal(where(`#cloud-config\nruncmd: "kubeadm init && ${SENTINEL}"\n`), 'elsewhere');
  assert.equal(where(`#!/bin/sh\nkubeadm init && ${SENTINEL}\n`), 'elsewhere');
  // A template with statements could render any runcmd.
  assert.equal(where(INIT.replace('runcmd:', '{% if true %}\nruncmd:').concat('{% endif %}\n')), 'elsewhere');
});

const mime = (parts: Array<{ type: string; body: string; base64?: boolean }>) =>
  [
    'Content-Type: multipart/mixed; boundary="MIMEBOUNDARY"',
    'MIME-Version: 1.0',
    '',
    ...parts.flatMap((p) => [
      '--MIMEBOUNDARY',
      `Content-Type: ${p.type}; charset="utf-8"`,
      ...(p.base64 ? ['Content-Transfer-Encoding: base64'] : []),
      'MIME-Version: 1.0',
      '',
      p.base64 ? Buffer.from(p.body).toString('base64') : p.body,
    ]),
    '--MIMEBOUNDARY--',
    '',
  ].join('\r\n');

test('MIME multipart: the text/cloud-config part read, base64 or not; a script part writing it is elsewhere', () => {
  const script = { type: 'text/x-shellscript', body: '#!/bin/sh\necho hello\n' };
  const plain = INIT.replace('## template: jinja\n', '');
  assert.equal(where(mime([script, { type: 'text/cloud-config', body: plain }])), 'last');
  assert.equal(where(mime([{ type: 'text/cloud-config', body: plain, base64: true }, script])), 'last');
  assert.equal(where(mime([{ type: 'text/jinja2', body: INIT }])), 'last');
  assert.equal(
    where(mime([{ type: 'text/cloud-config', body: JOIN_POST.replace('## template: jinja\n', '') }])),
    'elsewhere',
  );
  const inScript = { type: 'text/x-shellscript', body: `#!/bin/sh\nkubeadm init && ${SENTINEL}\n` };
  assert.equal(
    where(mime([{ type: 'text/cloud-config', body: '#cloud-config\nhostname: a\n' }, inScript])),
    'elsewhere',
  );
  // A later part's runcmd replaces an earlier one's; a merge directive is not followed.
  const later = { type: 'text/cloud-config', body: '#cloud-config\nruncmd:\n  - reboot\n' };
  assert.equal(where(mime([{ type: 'text/cloud-config', body: plain }, later])), 'elsewhere');
  const merging = { type: 'text/cloud-config', body: '#cloud-config\nmerge_how: list(append)\nruncmd: [true]\n' };
  assert.equal(where(mime([merging, { type: 'text/cloud-config', body: plain }])), 'elsewhere');
  // No path anywhere, base64 included: none.
  assert.equal(
    where(mime([{ type: 'text/cloud-config', body: '#cloud-config\nruncmd: [true]\n', base64: true }])),
    'none',
  );
});

test('no sentinel: none, answered without parsing', () => {
  for (const s of ['', '#cloud-config\nhostname: a\n', '#!/bin/sh\necho hi\n', 'not user-data at all']) {
    assert.equal(where(s), 'none');
    assert.equal(quickBootstrapSentinel(bytes(s)), 'none');
  }
  // YAML that would not parse is never parsed when the path is absent.
  assert.equal(quickBootstrapSentinel(bytes('#cloud-config\n: : [\n')), 'none');
  assert.equal(quickBootstrapSentinel(bytes(INIT)), undefined);
  assert.equal(quickBootstrapSentinel(gzipSync('#cloud-config\n')), undefined);
  assert.equal(runPure('bootstrapSentinel', [bytes(INIT), MAX]), 'last');
});

test('hostile user-data: never a throw, bounded by the user-data limit', () => {
  const path = BOOTSTRAP_SENTINEL_PATH;
  const cases: Array<[string, Uint8Array]> = [
    ['not YAML', bytes(`#cloud-config\nruncmd: [\n  - ${path}\n: :`)],
    ['invalid UTF-8', new Uint8Array([...Buffer.from(`#cloud-config\n# ${path}\n`), 0xff, 0xfe])],
    ['deep nesting', bytes(`#cloud-config\nx: ${'['.repeat(5000)}\n# ${path}\n`)],
    [
      'an alias bomb',
      bytes(
        `#cloud-config\na: &a ["${path}","${path}"]\n` +
          Array.from(
            { length: 30 },
            (_, i) =>
              `${String.fromCharCode(98 + (i % 20))}${i}: &x${i} [${i === 0 ? '*a' : `*x${i - 1}`},${i === 0 ? '*a' : `*x${i - 1}`}]`,
          ).join('\n') +
          '\n',
      ),
    ],
    ['a broken MIME message', bytes(`Content-Type: multipart/mixed\nMIME-Version: 1.0\n\n${path}`)],
    ['a corrupt gzip', new Uint8Array([0x1f, 0x8b, 1, 2, 3, ...Buffer.from(path)])],
    ['a recursive alias', bytes(`#cloud-config\nruncmd: &r [*r, "${SENTINEL}"]\n`)],
  ];
  for (const [what, data] of cases) {
    let got: string | undefined;
    assert.doesNotThrow(() => (got = bootstrapSentinel(data, MAX)), what);
    assert.ok(got === 'elsewhere' || got === 'none', `${what}: ${got}`);
  }
  // A large document of many runcmd lines: parsed within the limit, answered in bounded time.
  const large = `#cloud-config\nruncmd:\n${'  - echo filler line of runcmd\n'.repeat(30_000)}  - kubeadm init && ${SENTINEL}\n`;
  const started = performance.now();
  assert.equal(where(large), 'last');
  assert.ok(performance.now() - started < 10_000);
  // Past the limit it is not parsed: the path occurs, vmseed cannot tell.
  assert.equal(where(large, 1024), 'elsewhere');
  // A gzip bomb decompresses no further than the limit.
  const bomb = gzipSync(Buffer.concat([Buffer.from(`#cloud-config\n# ${path}\n`), Buffer.alloc(64 * 1024 * 1024)]));
  assert.equal(bootstrapSentinel(new Uint8Array(bomb), MAX), 'none');
});

test('a render keeps the one word on the seed: last, elsewhere, or nothing', async () => {
  // The annotation input, as vmseed's own API; a KubeVirt volume goes through the same composeSeed.
  const render = async (userData: string) => {
    const text = `userData: |\n${userData.replace(/^/gm, '  ')}`;
    const vmi = { metadata: { name: 'capi', namespace: 'ns', annotations: { [ANNOTATION]: text } }, spec: {} };
    const outcome = await renderSeed(vmi, new MemoryResolver({}), DEFAULT_RENDER_OPTIONS);
    assert.equal(outcome.kind, 'seed');
    return outcome.kind === 'seed' ? outcome.seed : undefined;
  };
  assert.equal((await render(INIT))?.bootstrapSentinel, 'last');
  assert.equal((await render(JOIN_POST))?.bootstrapSentinel, 'elsewhere');
  const plain = await render('#cloud-config\nhostname: a\n');
  assert.ok(plain && !('bootstrapSentinel' in plain));
});

test("KubeVirt IMDS's user-data annotation: the same word on its HTTP-only seed", async () => {
  const imds = (userData: string) => ({
    metadata: {
      name: 'capi',
      namespace: 'ns',
      uid: 'u1',
      annotations: { 'imds.kubevirt.io/enabled': 'true', 'imds.kubevirt.io/user-data': userData },
    },
    spec: { domain: { firmware: { serial: 'ds=nocloud;s=http://169.254.169.254/v1/' } } },
  });
  const seedOf = async (userData: string) => {
    const out = await renderSeed(imds(userData), new MemoryResolver({}), DEFAULT_RENDER_OPTIONS);
    assert.ok(out.kind === 'seed' && out.seed.delivery === 'http');
    return out.seed;
  };
  assert.equal((await seedOf(INIT)).bootstrapSentinel, 'last');
  assert.equal((await seedOf(JOIN_POST)).bootstrapSentinel, 'elsewhere');
  assert.ok(!('bootstrapSentinel' in (await seedOf('#cloud-config\nhostname: a\n'))));
});
