// The admission webhook's warnings about a VMI's cloud-init data, through
// the real HTTPS handler: each schema problem of the cloud-init volume's
// user-data and network data is one `response.warnings` line (what kubectl
// prints as `Warning: ...`); the answer stays allowed and the patch the same.
// Inline data is quoted as cloud-init quotes it; a Secret's content never.
import '../support/schema-files.ts';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { Buffer } from 'node:buffer';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import pino from 'pino';
import type { RefResolver, SecretObject } from '../../src/api/objects.ts';
import { RenderPool } from '../../src/agent/render-pool.ts';
import { serialMinter } from '../../src/commands/cluster/webhook.ts';
import { DEFAULT_SCHEMA_DIR, schemaStore } from '../../src/cloudinit/schema/schema-store.ts';
import type { CiProfile } from '../../src/cloudinit/schema/ci-validator.ts';
import { CLOUD_INIT_VERSION_ANNOTATION } from '../../src/cloudinit/schema/release-annotation.ts';
import {
  MAX_PROBLEM_WARNINGS,
  MAX_WARNING_BYTES,
  type SchemaWarningOptions,
} from '../../src/cluster/webhook/schema-warnings.ts';
import { startWebhookServer, type WebhookServer } from '../../src/cluster/webhook/webhook-server.ts';
import { certDir, clientPki, fixtureReview, patchOf, post, testPki, type Json } from '../support/webhook.ts';

const NS = 'tenant-a';
const SECRET_PASSWORD = '987654321987';
const SECRET_COMMAND = 'echo top-secret-value-42';

const secrets = new Map<string, SecretObject | Error | 'slow'>([
  [
    'bad-password',
    {
      metadata: { name: 'bad-password', namespace: NS },
      data: {
        userdata: Buffer.from(
          `#cloud-config\nusers:\n  - name: bob\n    passwd: ${SECRET_PASSWORD}\nruncmd: "${SECRET_COMMAND}"\n`,
        ).toString('base64'),
      },
    },
  ],
  [
    'net',
    {
      metadata: { name: 'net', namespace: NS },
      data: { networkData: Buffer.from('version: 2\nethernets:\n  eth0:\n    dhcp4: sometimes\n').toString('base64') },
    },
  ],
  ['forbidden', new Error('secrets "forbidden" is forbidden: the webhook may not get it')],
  ['slow', 'slow'],
]);

const resolver: RefResolver = {
  async getSecret(namespace, name) {
    assert.equal(namespace, NS);
    const s = secrets.get(name);
    if (s === 'slow') return new Promise(() => {});
    if (s instanceof Error) throw s;
    return s;
  },
  async getConfigMap(namespace, name) {
    assert.equal(namespace, NS);
    if (name !== 'cc') return undefined;
    return {
      metadata: { name: 'cc', namespace: NS },
      data: {
        'user-data': `#cloud-config\npackages: {${SECRET_COMMAND}: latest}\n`,
        'vendor-data': '#cloud-config\nbootcmd: "date"\n',
      },
    };
  },
};

let ca: string;
let dir: string;
let caFile: string;
let identity: { cert: string; key: string };
let pool: RenderPool;
const servers: WebhookServer[] = [];
const ready = new Set<CiProfile>(
  schemaStore(DEFAULT_SCHEMA_DIR)
    .status()
    .flatMap((s) => (s.state === 'ready' ? [s.release] : [])),
);

async function server(schemas?: Partial<SchemaWarningOptions>): Promise<WebhookServer> {
  const s = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: dir,
    // The API server's client certificate: its reviews may make the webhook
    // read the Secrets they name (src/cluster/webhook/review-trust.ts).
    clientAuth: { caFile },
    logger: pino({ level: 'silent' }),
    mutate: { serials: serialMinter('http://169.254.169.254/v1', 'nocloud-net') },
    ...(schemas
      ? {
          schemas: {
            dir: DEFAULT_SCHEMA_DIR,
            release: '25.1',
            available: ready,
            secrets: resolver,
            runner: pool,
            ...schemas,
          },
        }
      : {}),
  });
  servers.push(s);
  return s;
}

let main: WebhookServer;

before(async () => {
  assert.ok(ready.has('22.4') && ready.has('25.1'), `the schemas of both releases are under ${DEFAULT_SCHEMA_DIR}`);
  const pki = await testPki('webhook');
  ca = pki.caCert;
  dir = await certDir(pki);
  const client = await clientPki('webhook-client-ca', ['kube-apiserver']);
  identity = client.clients['kube-apiserver'];
  caFile = join(dir, 'client-ca.crt');
  await writeFile(caFile, client.caCert);
  for (const r of ready) schemaStore(DEFAULT_SCHEMA_DIR).validator(r, 'cloud-config');
  pool = new RenderPool({ size: 1, deadlineMs: 10_000 });
  // As the cluster component does at start: the worker's cold start (and
  // its schema compile) is not a VMI's admission time.
  await pool.run('checkSchemas', [{ dir: DEFAULT_SCHEMA_DIR, release: '25.1', reveal: false }], 1 << 20);
  main = await server({});
});

after(async () => {
  for (const s of servers) await s.close();
  await pool?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

// The vmi-direct fixture with this cloud-init volume and these annotations.
async function reviewOf(volume: Json, annotations: Record<string, string> = {}): Promise<Json> {
  const r = await fixtureReview('vmi-direct');
  const o = r.request.object;
  o.metadata.annotations = { ...o.metadata.annotations, ...annotations };
  o.spec.volumes = [...o.spec.volumes, { name: 'cloudinit', ...volume }];
  return r;
}

async function admit(
  body: Json,
  on: WebhookServer = main,
): Promise<{ warnings: string[]; body: string; json: Json; patch: Json[] | undefined }> {
  const answer = await post(on.address.port, ca, JSON.stringify(body), { identity });
  assert.equal(answer.status, 200, answer.body);
  assert.equal(answer.json!.response.allowed, true);
  assert.equal(answer.json!.response.uid, body.request.uid);
  const warnings = (answer.json!.response.warnings ?? []) as string[];
  for (const w of warnings) assert.ok(Buffer.byteLength(w) <= MAX_WARNING_BYTES, w);
  return { warnings, body: answer.body, json: answer.json!, patch: patchOf(answer) };
}

const noCloud = (userData: string) => ({ cloudInitNoCloud: { userData } });

test('inline runcmd as a string: allowed, one warning quoting the value, with the release; the patch is the same', async () => {
  const r = await reviewOf(noCloud('#cloud-config\nruncmd: "echo hi"\n'));
  const { warnings, patch } = await admit(r);
  assert.deepEqual(warnings, ["user-data: runcmd: 'echo hi' is not of type 'array' (cloud-init 25.1)"]);
  // Without the check, the same operations (the serial's token aside).
  const plain = await admit(r, await server());
  assert.equal(plain.json.response.warnings, undefined);
  const shape = (p: Json[] | undefined) => p?.map((op) => `${op.op} ${op.path}`);
  assert.deepEqual(shape(patch), shape(plain.patch));
  assert.ok(patch && patch.length > 0);
});

test('base64 inline data and a ConfigDrive volume are read too; deprecations say so', async () => {
  const b64 = Buffer.from('#cloud-config\nchpasswd:\n  list: |\n    root:x\n').toString('base64');
  const { warnings } = await admit(await reviewOf({ cloudInitConfigDrive: { userDataBase64: b64 } }));
  assert.equal(warnings.length, 1);
  assert.match(
    warnings[0],
    /^user-data: chpasswd\.list: deprecated: .*Deprecated in version 22\.2.* \(cloud-init 25\.1\)$/,
  );
});

test('Secret-backed user-data: the path and the kind, never the value', async () => {
  const { warnings, body } = await admit(await reviewOf({ cloudInitNoCloud: { secretRef: { name: 'bad-password' } } }));
  assert.deepEqual(warnings, [
    `user-data (Secret ${NS}/bad-password): runcmd: a string is not of type 'array' (cloud-init 25.1)`,
    `user-data (Secret ${NS}/bad-password): users.0.passwd: an integer is not of type 'string' (cloud-init 25.1)`,
  ]);
  assert.ok(!body.includes(SECRET_PASSWORD), body);
  assert.ok(!body.includes('top-secret'), body);
});

test('non-empty Secret content wins over inline data, as in KubeVirt; network data from a Secret', async () => {
  const { warnings } = await admit(
    await reviewOf({
      cloudInitNoCloud: {
        userData: '#cloud-config\nruncmd: "inline, not used"\n',
        secretRef: { name: 'bad-password' },
        networkDataSecretRef: { name: 'net' },
      },
    }),
  );
  assert.ok(!warnings.some((w) => w.includes('inline, not used')), warnings.join('\n'));
  assert.ok(warnings.some((w) => w.startsWith(`user-data (Secret ${NS}/bad-password): runcmd:`)));
  assert.ok(
    warnings.includes(
      `network-data (Secret ${NS}/net): ethernets.eth0.dhcp4: a string is not one of ['yes', 'no', True, False] (cloud-init 25.1)`,
    ),
    warnings.join('\n'),
  );
});

test('inline network data of a NoCloud volume is checked and quoted', async () => {
  const { warnings } = await admit(
    await reviewOf({ cloudInitNoCloud: { networkData: 'version: 2\nethernets:\n  eth0:\n    dhcp4: sometimes\n' } }),
  );
  assert.deepEqual(warnings, [
    "network-data: ethernets.eth0.dhcp4: 'sometimes' is not one of ['yes', 'no', True, False] (cloud-init 25.1)",
  ]);
});

test('the release: the annotation picks 22.4 or 25.1 (an unknown top-level key warns only under 25.1), off checks nothing', async () => {
  const vol = noCloud('#cloud-config\nbogus: 1\n');
  const under = async (v?: string) =>
    (await admit(await reviewOf(vol, v === undefined ? {} : { [CLOUD_INIT_VERSION_ANNOTATION]: v }))).warnings;
  assert.deepEqual(await under('22.4'), []);
  const w25 = await under('25.1');
  assert.equal(w25.length, 1);
  assert.match(
    w25[0],
    /^user-data: bogus: Additional properties are not allowed \('bogus' was unexpected\) \(cloud-init 25\.1\)$/,
  );
  assert.deepEqual(await under(), w25);
  assert.deepEqual(await under('off'), []);
  // 22.4 finds what 22.4 finds, and says it.
  const r22 = await reviewOf(noCloud('#cloud-config\nruncmd: "echo hi"\n'), {
    [CLOUD_INIT_VERSION_ANNOTATION]: '22.4',
  });
  assert.deepEqual((await admit(r22)).warnings, [
    "user-data: runcmd: 'echo hi' is not of type 'array' (cloud-init 22.4)",
  ]);
});

test('an unknown release in the annotation: one warning naming the allowed values, checked against the default', async () => {
  const { warnings } = await admit(
    await reviewOf(noCloud('#cloud-config\nruncmd: "echo hi"\n'), { [CLOUD_INIT_VERSION_ANNOTATION]: '19.1' }),
  );
  assert.equal(warnings.length, 2);
  assert.match(warnings[0], /^vmseed\.io\/cloud-init-version: "19\.1" is not one of 22\.4, 25\.1, off$/);
  assert.match(warnings[1], /\(cloud-init 25\.1\)$/);
});

test('--cloud-init-version off, or no schema files: no warnings', async () => {
  const r = await reviewOf(noCloud('#cloud-config\nruncmd: "echo hi"\n'));
  assert.deepEqual((await admit(r, await server({ release: 'off' }))).warnings, []);
  assert.deepEqual((await admit(r, await server({ available: new Set() }))).warnings, []);
});

test('a clean cloud-config, a shell script, or no cloud-init volume: no warnings', async () => {
  const clean = '#cloud-config\nhostname: web\nruncmd:\n  - [echo, hi]\npackages: [nginx]\n';
  assert.deepEqual((await admit(await reviewOf(noCloud(clean)))).warnings, []);
  assert.deepEqual((await admit(await reviewOf(noCloud('#!/bin/sh\necho hi\n')))).warnings, []);
  const none = await fixtureReview('vmi-direct');
  const answer = await post(main.address.port, ca, JSON.stringify(none), { identity });
  assert.equal(answer.json!.response.warnings, undefined);
});

test('an unreadable or missing Secret: allowed, one "not checked" line, nothing about the content', async () => {
  for (const name of ['forbidden', 'absent']) {
    const { warnings } = await admit(await reviewOf({ cloudInitNoCloud: { secretRef: { name } } }));
    assert.equal(warnings.length, 1, warnings.join('\n'));
    assert.ok(warnings[0].startsWith(`user-data (Secret ${NS}/${name}): not checked: `), warnings[0]);
  }
  // No API credentials at all.
  const noApi = await server({ secrets: undefined, secretsUnavailable: 'no API credentials' });
  const { warnings } = await admit(
    await reviewOf({ cloudInitNoCloud: { secretRef: { name: 'bad-password' } } }),
    noApi,
  );
  assert.deepEqual(warnings, [
    `user-data (Secret ${NS}/bad-password): not checked: no API credentials (cloud-init 25.1)`,
  ]);
});

test('30 problems: 20 warnings and one "more" line, each at most 256 bytes', async () => {
  const users = Array.from({ length: 30 }, (_, i) => `  - name: u${i}\n    passwd: ${i}\n`).join('');
  const { warnings } = await admit(await reviewOf(noCloud(`#cloud-config\nusers:\n${users}`)));
  assert.equal(warnings.length, MAX_PROBLEM_WARNINGS + 1, warnings.join('\n'));
  assert.equal(warnings.at(-1), '10 more problems not listed (cloud-init 25.1)');
  assert.equal(warnings[0], "user-data: users.0.passwd: 0 is not of type 'string' (cloud-init 25.1)");
  assert.ok(warnings.slice(0, -1).every((w) => w.startsWith('user-data: users.') && w.endsWith(' (cloud-init 25.1)')));
});

test("long problems are cut to 256 bytes, and the whole stays well under the API server's 4 KiB", async () => {
  const sources = Array.from({ length: 30 }, (_, i) => `    ${'s'.repeat(240)}${i}:\n      source: 5\n`).join('');
  const { warnings } = await admit(await reviewOf(noCloud(`#cloud-config\napt:\n  sources:\n${sources}`)));
  const more = /^(\d+) more problems not listed \(cloud-init 25\.1\)$/.exec(warnings.at(-1)!);
  assert.ok(more, warnings.at(-1));
  assert.equal(warnings.length - 1 + Number(more[1]), 30);
  for (const w of warnings.slice(0, -1)) {
    assert.ok(w.startsWith('user-data: apt.sources.sss') && w.endsWith('... (cloud-init 25.1)'), w);
    assert.ok(Buffer.byteLength(w) <= MAX_WARNING_BYTES);
  }
  assert.ok(Buffer.byteLength(warnings.join('')) <= 3 * 1024, String(Buffer.byteLength(warnings.join(''))));
});

test('a large document is checked on a worker; one that takes too long is answered in time with one warning', async () => {
  const big = `#cloud-config\nruncmd: "echo hi"\nwrite_files:\n${Array.from(
    { length: 2_000 },
    (_, i) => `  - path: /etc/f${i}\n    content: ${'x'.repeat(40)}\n`,
  ).join('')}`;
  assert.ok(big.length > 64 * 1024);
  const before = pool.offloaded;
  const { warnings } = await admit(await reviewOf(noCloud(big)));
  assert.deepEqual(warnings, ["user-data: runcmd: 'echo hi' is not of type 'array' (cloud-init 25.1)"]);
  assert.equal(pool.offloaded, before + 1);
  assert.equal(pool.started, 1, 'the warmed worker');

  const slow = await server({ timeoutMs: 200 });
  const started = performance.now();
  const late = await admit(await reviewOf({ cloudInitNoCloud: { secretRef: { name: 'slow' } } }), slow);
  assert.ok(performance.now() - started < 2_000);
  assert.deepEqual(late.warnings, ['cloud-config not checked: took too long (cloud-init 25.1)']);
  assert.ok(late.patch && late.patch.length > 0, 'the VMI is still patched');
});

test("vmseed's annotation: its inline user-data and vendor-data quoted, userDataFrom's and vendorDataFrom's objects never", async () => {
  const r = await fixtureReview('vmi-direct');
  r.request.object.metadata.annotations = {
    ...r.request.object.metadata.annotations,
    'vmseed.io/cloud-init': [
      'userData: |',
      '  #cloud-config',
      '  runcmd: "echo hi"',
      'userDataFrom: {kind: configmap, name: cc, key: user-data}',
      'vendorData: |',
      '  #cloud-config',
      '  write_files: [{path: /x, contents: y}]',
      'vendorDataFrom: {kind: configmap, name: cc}',
    ].join('\n'),
  };
  const { warnings, body } = await admit(r);
  // vendorData and vendorDataFrom together are refused by the annotation's parser: no documents then.
  assert.deepEqual(warnings, []);
  delete r.request.object.metadata.annotations['vmseed.io/cloud-init'];
  r.request.object.metadata.annotations['vmseed.io/cloud-init'] = [
    'userData: |',
    '  #cloud-config',
    '  runcmd: "echo hi"',
    'userDataFrom: {kind: configmap, name: cc, key: user-data}',
    'vendorDataFrom: {kind: configmap, name: cc}',
  ].join('\n');
  const second = await admit(r);
  assert.deepEqual(second.warnings, [
    "user-data: runcmd: 'echo hi' is not of type 'array' (cloud-init 25.1)",
    `user-data (ConfigMap ${NS}/cc): packages: an object is not of type 'array' (cloud-init 25.1)`,
    `vendor-data (ConfigMap ${NS}/cc): bootcmd: a string is not of type 'array' (cloud-init 25.1)`,
  ]);
  assert.ok(!second.body.includes('top-secret'), second.body);
  assert.ok(!body.includes('top-secret'), body);
});

test('the release annotation is read as the agent reads it: surrounding spaces are ignored', async () => {
  const { warnings } = await admit(
    await reviewOf(noCloud('#cloud-config\nbogus: 1\n'), { [CLOUD_INIT_VERSION_ANNOTATION]: ' 22.4 ' }),
  );
  // 22.4 has no top-level additionalProperties: nothing to say, and no "not one of" line.
  assert.deepEqual(warnings, []);
});
