// Nothing a pod can read gives a datasource token. The real agent CLI with
// the NoCloud HTTP datasource on and a few VMIs (NoCloud, ConfigDrive, one
// that fails), logging at trace level, probes and status pages on two
// listeners, in local mode (Events in the log) and against the fake API
// server (Events posted to it): every page, JSON document, metric, response
// header, log line and Event is searched for each VMI's token, seed URL and
// DMI serial as `vmseed seed-url` computes them, and for the datasource keys
// themselves, each in every form a leak takes (base64, JSON, URL, hex).
// The guests' own fetches run first, so the token really was in use, and
// the serial printed by seed-url really opens the seed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { NODE, tempDir, waitFor } from '../support/agent-harness.ts';
import { FakeKube } from '../support/fake-kube.ts';
import { load as loadYaml } from 'js-yaml';
import type { VmiObject } from '../../src/api/objects.ts';
import { fetchAll, type FetchedRoute } from '../support/fetch-all.ts';
import { runCli } from '../support/cli.ts';
import { datasourceSerialFor } from '../../src/datasource/url.ts';
import { DatasourceKeyring, parseKeyFile } from '../../src/datasource/tokens.ts';
import { findSecret, secretForms } from '../support/secret-forms.ts';
import { get as getFrom } from '../datasource/imds-support.ts';

const ROOT = new URL('../../', import.meta.url).pathname;

interface Vm {
  name: string;
  uid: string;
  annotation: string;
  state: 'ready' | 'error';
  served: boolean; // NoCloud on disk: the datasource answers its token
}

function vms(): Vm[] {
  const ud = (n: string) => `userData: |\n  #cloud-config\n  hostname: ${n}\n`;
  return [
    { name: 'alpha', uid: randomUUID(), annotation: ud('alpha'), state: 'ready', served: true },
    { name: 'beta', uid: randomUUID(), annotation: ud('beta'), state: 'ready', served: true },
    {
      name: 'gamma',
      uid: randomUUID(),
      annotation: `${ud('gamma')}networkData: |\n  version: 2\n  ethernets: {eth0: {dhcp4: true}}\n`,
      state: 'ready',
      served: true,
    },
    {
      name: 'cd',
      uid: randomUUID(),
      annotation: `datasource: configdrive\n${ud('cd')}`,
      state: 'ready',
      served: false,
    },
    {
      name: 'broken',
      uid: randomUUID(),
      annotation: 'userDataBase64: "not base64!!"\n',
      state: 'error',
      served: false,
    },
  ];
}

function manifest(v: Vm): string {
  const annotation = v.annotation
    .split('\n')
    .map((l) => (l ? `      ${l}` : l))
    .join('\n');
  return `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: ${v.name}
  namespace: tenant-${v.name}
  uid: ${v.uid}
  annotations:
    vmseed.io/cloud-init: |
${annotation}
spec:
  domain: {}
`;
}

interface Mode {
  name: string;
  // Puts the VMIs where the agent finds them; returns the agent's own flags,
  // and where each guest's requests come from (its launcher pod's IP).
  setup(
    dir: string,
    all: Vm[],
  ): Promise<{ args: string[]; env: Record<string, string>; events(): string[]; from?(v: Vm): string }>;
}

const LOCAL: Mode = {
  name: 'local mode',
  async setup(dir, all) {
    const manifests = join(dir, 'manifests');
    await mkdir(manifests);
    for (const v of all) await writeFile(join(manifests, `${v.name}.yaml`), manifest(v));
    // Local mode's Events are log lines: searched with the log.
    return { args: ['--local', manifests], env: {}, events: () => [] };
  },
};

function clusterMode(fake: FakeKube): Mode {
  return {
    name: 'cluster mode',
    async setup(dir, all) {
      // A VM is its launcher pod: the datasource answers each only from
      // its pod's IP, one 127.0.0.x per VMI.
      const ip = (v: Vm) => `127.0.0.${10 + all.indexOf(v)}`;
      for (const v of all) {
        const obj = loadYaml(manifest(v)) as VmiObject;
        const pod = randomUUID();
        obj.metadata.labels = { 'kubevirt.io/nodeName': NODE };
        obj.status = { nodeName: NODE, phase: 'Scheduled', activePods: { [pod]: NODE } };
        assert.equal(fake.applyVmi(obj).metadata.uid, v.uid);
        fake.setLauncherPod(`tenant-${v.name}`, `virt-launcher-${v.name}`, pod, NODE, [ip(v)], v.uid);
      }
      const kubeconfig = await fake.writeKubeconfig(dir);
      return {
        args: ['--kubeconfig', kubeconfig, '--libvirt', 'off'],
        env: { NODE_NAME: NODE },
        events: () => fake.events().map((e) => JSON.stringify(e)),
        from: ip,
      };
    },
  };
}

test(
  'local mode, datasource on: no token, seed URL or serial on any page, metric, log line or Event',
  { timeout: 180_000 },
  async (t) => {
    await noToken(t, LOCAL);
  },
);

test(
  'cluster mode, datasource on: no token, seed URL or serial on any page, metric, log line or Event',
  { timeout: 180_000 },
  async (t) => {
    const fake = await FakeKube.start();
    t.after(() => fake.close());
    await noToken(t, clusterMode(fake));
  },
);

async function noToken(t: { after(fn: () => unknown): void }, mode: Mode): Promise<void> {
  const dir = await tempDir('vmseed-no-token-');
  t.after(() => dir.remove());
  const all = vms();
  const setup = await mode.setup(dir.path, all);
  const keyFile = join(dir.path, 'keys');
  const keys = [randomBytes(32), randomBytes(32)];
  await writeFile(keyFile, keys.map((k) => `${k.toString('base64')}\n`).join(''));

  const child = spawn(
    process.execPath,
    [
      join(ROOT, 'src/main.ts'),
      'agent',
      ...setup.args,
      '--state-dir',
      join(dir.path, 'seeds'),
      '--listen',
      '127.0.0.1:0',
      '--status-listen',
      '127.0.0.2:0',
      '--log-level',
      'trace',
      '--datasource-listen',
      '127.0.0.1:0',
      '--datasource-key-file',
      keyFile,
    ],
    { cwd: dir.path, env: { ...process.env, ...setup.env }, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
  t.after(() => void (child.exitCode === null && child.kill('SIGKILL')));

  const url = await waitFor(
    'probe listener',
    () => /"url":"(http:\/\/127\.0\.0\.1:\d+)","listen":"[^"]*","serve":"probes"/.exec(out)?.[1],
    60_000,
  );
  const statusUrl = await waitFor(
    'status listener',
    () => /"url":"(http:\/\/127\.0\.0\.2:\d+)","listen":"[^"]*","serve":"status"/.exec(out)?.[1],
    60_000,
  );
  const dsPort = Number(
    await waitFor(
      'datasource listener',
      () => /"port":(\d+)[^\n]*NoCloud HTTP datasource listening/.exec(out)?.[1],
      60_000,
    ),
  );
  const base = `http://127.0.0.1:${dsPort}/v1`;

  type JsonVmi = { name: string; state: string; servedOverHttp?: boolean };
  const vmis = await waitFor(
    'every VMI settled',
    async () => {
      const s = (await (await fetch(`${statusUrl}/status.json`)).json()) as { vmis: JsonVmi[] };
      return all.every((v) => s.vmis.some((x) => x.name === v.name && x.state === v.state)) && s.vmis;
    },
    60_000,
  );
  for (const v of all)
    assert.equal(vmis.find((x) => x.name === v.name)!.servedOverHttp === true, v.served, `${v.name}: servedOverHttp`);

  // What an entitled owner gets: the serial from seed-url, with the key.
  const keyring = new DatasourceKeyring(parseKeyFile(readFileSync(keyFile, 'utf8'), keyFile));
  const secrets: Array<{ vm: string; what: string; value: string | Buffer }> = keys.map((k, i) => ({
    vm: 'the node',
    what: `datasource key ${i + 1}`,
    value: k,
  }));
  for (const v of all) {
    const cli = await runCli(
      ['seed-url', `tenant-${v.name}/${v.name}`, '--uid', v.uid, '--key-file', keyFile, '--base', base],
      dir.path,
    );
    assert.equal(cli.code, 0, cli.err);
    const serial = cli.out.toString().trim();
    assert.equal(serial, datasourceSerialFor(keyring, v.uid, base));
    const seedUrl = serial.replace(/^ds=nocloud;s=/, '');
    const token = /\/v1\/([A-Za-z0-9_-]{43})\/$/.exec(seedUrl)?.[1];
    assert.ok(token, serial);
    // The second key's token is accepted too: no page may show it either.
    const other = new DatasourceKeyring(
      parseKeyFile(readFileSync(keyFile, 'utf8').split('\n').slice(1).join('\n'), keyFile),
    ).sign(v.uid);
    secrets.push(
      { vm: v.name, what: 'serial', value: serial },
      { vm: v.name, what: 'seed URL', value: seedUrl },
      { vm: v.name, what: 'token', value: token },
      { vm: v.name, what: 'second-key token', value: other },
    );
    // Guests fetch with it (so the serving paths log what they log).
    const from = setup.from?.(v) ?? '127.0.0.1';
    const guestGet = async (u: string) => (await getFrom(dsPort, new URL(u).pathname, {}, from)).status;
    for (const f of ['meta-data', 'user-data', 'vendor-data', 'network-config']) {
      const status = await guestGet(`${seedUrl}${f}`);
      if (v.served && f !== 'network-config') assert.equal(status, 200, `${v.name} ${f}`);
      if (!v.served) assert.equal(status, 404, `${v.name} ${f}`);
    }
    assert.equal(await guestGet(`${base}/${other}/user-data`), v.served ? 200 : 404);
  }
  // The fetches are recorded (the pages below are the ones that know about them).
  await waitFor(
    'fetches on /status.json',
    async () => {
      const s = (await (await fetch(`${statusUrl}/status.json`)).json()) as {
        vmis: Array<{ name: string; lastFetch?: Record<string, string> }>;
      };
      return all.filter((v) => v.served).every((v) => s.vmis.find((x) => x.name === v.name)?.lastFetch?.['user-data']);
    },
    60_000,
  );

  const routes: Array<FetchedRoute & { listener: string }> = [
    ...(await fetchAll(url)).map((r) => ({ ...r, listener: 'probes' })),
    ...(await fetchAll(statusUrl)).map((r) => ({ ...r, listener: 'status' })),
  ];
  // The split holds: detail on the status listener only, probes on the other.
  const get = (listener: string, path: string) => routes.find((r) => r.listener === listener && r.path === path)!;
  for (const p of ['/metrics', '/healthz', '/readyz']) {
    assert.equal(get('probes', p).status, 200, `probes ${p}`);
    assert.equal(get('status', p).status, 404, `status ${p}`);
  }
  for (const p of ['/status', '/status.json']) {
    assert.equal(get('probes', p).status, 404, `probes ${p}`);
    assert.equal(get('status', p).status, 200, `status ${p}`);
  }
  for (const v of all)
    assert.equal(get('status', `/status/tenant-${v.name}/${v.name}`).status, 200, `detail page of ${v.name}`);
  assert.match(get('status', '/status/tenant-alpha/alpha').body, /vmseed seed-url tenant-alpha\/alpha --uid/);
  assert.match(get('probes', '/metrics').body, /vmseed_datasource_requests_total\{[^}]*status="200"/);

  child.kill('SIGTERM');
  assert.equal(await exited, 0, out.slice(-2000));
  const lines = out.split('\n').filter(Boolean);
  const events = setup.events();
  const eventTexts = mode === LOCAL ? lines : events;
  assert.ok(
    eventTexts.some((l) => l.includes('"reason":"SeedReady"')),
    `${mode.name}: SeedReady Events searched`,
  );
  assert.ok(
    eventTexts.some((l) => l.includes('"reason":"SeedFailed"')),
    `${mode.name}: SeedFailed Events searched`,
  );
  assert.ok(
    lines.some((l) => l.includes('served seed file')),
    'datasource fetches are in the log',
  );

  const texts = [
    ...routes.map((r) => ({ where: `${r.listener} ${r.path}`, text: `${JSON.stringify(r.headers)}\n${r.body}` })),
    ...lines.map((l, i) => ({ where: `log line ${i}`, text: l })),
    ...events.map((e, i) => ({ where: `Event ${i}`, text: e })),
  ];
  assert.ok(texts.length > 60, `searched ${texts.length} texts`);
  for (const s of secrets) {
    const forms = secretForms(s.value);
    for (const x of texts) {
      const found = findSecret(x.text, forms);
      assert.equal(
        found,
        undefined,
        `${x.where} carries ${s.vm}'s ${s.what} (${found?.form}): …${x.text.slice(Math.max(0, (found?.at ?? 0) - 120), (found?.at ?? 0) + 60)}…`,
      );
    }
  }
  for (const x of texts) assert.doesNotMatch(x.text, /ds=nocloud;s=/, `${x.where} carries a serial`);
}
