// Every credential the project hands out, in use at once, and none of it
// anywhere an operator or a scraper looks. One in-process agent against the
// fake API server, its NoCloud HTTP datasource on (--pods-dir, progress
// reports, the provisioning annotation), logging at trace level. One VMI
// holds every token kind:
//  - its UID token (HMAC of its UID under the datasource key, what
//    `vmseed seed-url --uid` prints), fetched with, also before the VMI
//    exists (the early-boot miss path);
//  - its serial token, inside spec.domain.firmware.serial as the admission
//    webhook writes it (however the webhook mints it: the test reads it back
//    from the serial), fetched with, also before the VMI exists;
//  - its report token, read from the vendor-data the seed hands the guest,
//    and cloud-init's progress events posted with it (and a malformed one);
//  - its launcher pod's ServiceAccount token (a JWT in the kubelet's
//    projected volume) fetched from /v1/<token>/token;
// and its user-data comes from a Secret. A second VMI's pod holds a token
// that names another namespace: refused, never shown. The datasource keys
// (the signing key and a still-accepted one) are secrets too, and so is an
// IMDS session token (--datasource-imds-session optional: `PUT
// /v1/<token>/session`, then sent with /v1/<token>/identity, and a refused
// replay of it).
//
// Searched, for each secret in every form of secret-forms.ts (plain,
// base64/base64url at any offset, JSON-escaped in several dialects,
// URL-encoded, form-encoded, HTML-escaped, hex): every log line (the agent's
// and the datasource's), the agent's /metrics and the datasource's metrics,
// every page (/status, each /status/<ns>/<name>, filtered lists), every
// /status.json, every Event the fake API server stored after each create or
// patch, and every annotation the agent patched onto a VMI. Each sink is
// first checked to have really been captured and to hold the flow.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeKube } from '../support/fake-kube.ts';
import { NODE, startAgent, tempDir, vmi, waitFor } from '../support/agent-harness.ts';
import { GUEST_BASE_URL, loopbackDatasource, startedDatasource } from '../support/agent-datasource.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { fetchAll } from '../support/fetch-all.ts';
import { findSecret, secretForms } from '../support/secret-forms.ts';
import { keyLine, randomKey } from '../datasource/datasource-fixtures.ts';
import { get as httpGet, launcherJwt, projectedToken } from '../datasource/imds-support.ts';
import { prepareNocloudHttp } from '../../src/commands/agent/datasource.ts';
import { progressReportPlanner } from '../../src/agent/provisioning/report-plan.ts';
import { PROVISIONING_ANNOTATION, type ProvisioningSummary } from '../../src/agent/provisioning/summary.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { startHttpServer } from '../../src/http/status-server.ts';
import { mutateVmi, GATE_ANNOTATION, type PatchOperation } from '../../src/cluster/webhook/mutate.ts';
import { serialMinter } from '../../src/commands/cluster/webhook.ts';
import { IMDS_OPT_IN } from '../../src/datasource/imds/facts.ts';
import { reportToken } from '../../src/datasource/reports/report-token.ts';
import type { VmiObject } from '../../src/api/objects.ts';

const NS = 'tenant';
const POD = '3f2a1b0c-9d8e-4f7a-8b6c-5d4e3f2a1b01';
const POD_OTHER = '3f2a1b0c-9d8e-4f7a-8b6c-5d4e3f2a1b02';
const SUCCESS = JSON.parse(
  readFileSync(new URL('../fixtures/cloud-init-events/boot-success.json', import.meta.url), 'utf8'),
) as object[];

// The serial the admission webhook writes into a VMI being created: its
// pure mutation, with the cluster component's minter (a fresh random token
// in each serial; earlier, an HMAC of a binding under the datasource key).
// Adapt here when the webhook's minting API changes; the scan reads the
// token back from the serial, whatever made it.
function admitWithSerial(v: VmiObject): VmiObject {
  const ops = mutateVmi(structuredClone(v), { serials: serialMinter(GUEST_BASE_URL, 'nocloud') });
  return applyOps(structuredClone(v), ops);
}

// JSON Patch `add`/`replace` (all mutateVmi makes), as the API server applies it.
function applyOps<T>(object: T, ops: PatchOperation[]): T {
  for (const op of ops) {
    const path = op.path
      .split('/')
      .slice(1)
      .map((s) => s.replaceAll('~1', '/').replaceAll('~0', '~'));
    let at = object as Record<string, unknown>;
    for (const s of path.slice(0, -1)) at = at[s] as Record<string, unknown>;
    assert.ok(op.op === 'add' || op.op === 'replace', `no ${op.op} in this test's patches`);
    at[path[path.length - 1]] = structuredClone(op.value);
  }
  return object;
}

// The token in a NoCloud serial `ds=nocloud;s=<base>/<token>/`.
function serialTokenOf(serial: string | undefined): string {
  const token = /^ds=nocloud(?:-net)?;s=[^;]*\/([A-Za-z0-9_-]{43})\/$/.exec(serial ?? '')?.[1];
  assert.ok(token, `no token in the serial ${JSON.stringify(serial)}`);
  return token;
}

// A launcher pod's projected ServiceAccount token, unique to this run (a
// real signature is as random as this one).
function saToken(namespace: string, pod: string): string {
  const unsigned = launcherJwt(
    { exp: Math.floor(Date.now() / 1000) + 3600, jti: randomUUID(), sub: `system:serviceaccount:${namespace}:builder` },
    { namespace, serviceAccount: 'builder', pod, podName: `virt-launcher-${pod.slice(0, 5)}` },
  );
  return `${unsigned.slice(0, unsigned.lastIndexOf('.'))}.${randomBytes(64).toString('base64url')}`;
}

function launcherOf(v: VmiObject, pod: string): VmiObject {
  v.metadata.annotations![IMDS_OPT_IN] = 'true';
  v.spec.volumes = [{ name: 'sa', serviceAccount: { serviceAccountName: 'builder' } }];
  v.status = { nodeName: NODE, phase: 'Running', activePods: { [pod]: NODE } };
  return v;
}

test('harness: the forms a leak takes through JSON dialects, query strings, HTML and base64 in JSON', () => {
  const serial = 'ds=nocloud;s=http://169.254.169.254/v1/AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdE/';
  const key = Buffer.from('fb+/Zm9vYmFyYmF6cXV4cXV1eHh4eHh4eHh4eHh4eHg=', 'base64');
  const serialForms = secretForms(serial);
  const keyForms = secretForms(key);
  const found = (text: string, forms = serialForms) => findSecret(text, forms)?.form;
  const json = JSON.stringify({ serial });
  assert.equal(found(json), 'plain', 'JSON.stringify leaves a serial as it is');
  assert.equal(found(json.replaceAll('/', '\\/')), 'JSON-escaped, / as \\/');
  assert.equal(found(json.replaceAll('/', '\\u002f')), 'JSON-escaped, / as \\u00xx');
  assert.equal(found(json.replaceAll('/', '\\u002F')), 'JSON-escaped, / as \\u00XX');
  assert.equal(found(json.replaceAll('/', '\\u002f').replaceAll('=', '\\u003d')), "JSON-escaped, /+=<>&' as \\u00xx");
  assert.equal(
    found(`?s=${encodeURIComponent(serial).replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase())}`),
    'URL-encoded, lower-case hex',
  );
  assert.equal(found(new URLSearchParams({ s: `a b ${serial}` }).toString()), 'URL-encoded');
  assert.equal(found(new URLSearchParams({ s: 'x y' }).toString(), secretForms('x y')), 'form-encoded');
  const b64 = key.toString('base64');
  assert.ok(b64.includes('+') && b64.includes('/'), b64);
  assert.equal(found(`<td>${b64}</td>`, keyForms), 'base64 (offset 0)');
  assert.equal(found(`{"k":"x${b64}"}`.replaceAll('/', '\\/'), keyForms), 'base64 (offset 0), JSON-escaped, / as \\/');
  assert.equal(
    found(`{"k":"${b64.replaceAll('+', '\\u002b').replaceAll('/', '\\u002f')}"}`, keyForms),
    'base64 (offset 0), JSON-escaped, /+ as \\u00xx',
  );
  assert.equal(found(`?k=${encodeURIComponent(`x${b64}`)}`, keyForms), 'base64 (offset 0), URL-encoded');
  assert.equal(found(`it's <b>`, secretForms(`it's <b>`)), 'plain');
  assert.equal(found('it&#39;s &lt;b&gt;', secretForms(`it's <b>`)), 'HTML-escaped');
  assert.equal(found(json, keyForms), undefined);
});

test(
  'every token kind in use, at trace level: none in logs, metrics, pages, status.json, Events or annotations',
  { timeout: 90_000 },
  async (t) => {
    // No RBAC: what is searched here is what the agent writes, not what it may read
    // (the install's grants are the RBAC tests' business, and move with the manifests).
    const fake = await FakeKube.start({ rbac: false });
    const dir = await tempDir('vmseed-every-token-');
    t.after(async () => {
      await fake.close();
      await dir.remove();
    });
    const keys = [randomKey(), randomKey()];
    const keyFile = join(dir.path, 'keys');
    await writeFile(keyFile, keys.map((k) => `${keyLine(k)}\n`).join(''));
    const podsDir = join(dir.path, 'pods');
    const sa = saToken(NS, POD);
    await projectedToken(podsDir, POD, sa);
    // The other pod's token names another namespace: /v1/token refuses it.
    const saForeign = saToken('elsewhere', POD_OTHER);
    await projectedToken(podsDir, POD_OTHER, saForeign);
    const marker = `MRK${randomBytes(8).toString('hex')}userdata`;
    const userData = `#cloud-config\nbootcmd: [echo ${marker}]\nchpasswd: {list: "root:${marker}"}\n`;
    fake.setSecret({ metadata: { name: 'ud', namespace: NS }, stringData: { userdata: userData } });

    // Everything the API server stores, after each write the agent makes.
    const written = { events: new Set<string>(), annotations: [] as Record<string, string>[], patches: 0 };
    const applied = new Map<string, Record<string, string>>();
    fake.afterAnswer((r) => {
      if (r.status < 200 || r.status > 299) return;
      if (r.resource === 'events' && (r.verb === 'create' || r.verb === 'patch'))
        for (const e of fake.events()) written.events.add(JSON.stringify(e));
      if (r.resource === 'virtualmachineinstances' && r.verb === 'patch') {
        written.patches++;
        const now = fake.getVmi(r.namespace!, r.name!)?.metadata;
        const before = applied.get(`${r.namespace}/${r.name}`) ?? {};
        // What the agent wrote: every annotation or label that is not as the test applied it.
        const changed = Object.entries({ ...now?.labels, ...now?.annotations }).filter(([k, v]) => before[k] !== v);
        written.annotations.push(Object.fromEntries(changed));
      }
    });

    const dsLog = captureLogger('trace');
    const dsMetrics = createMetrics({ version: 'test', processMetrics: false });
    const ds = await prepareNocloudHttp(
      loopbackDatasource(keyFile, { podsDir, imdsSession: 'optional' }),
      dsLog.logger,
      dsMetrics,
    );
    const listener = startedDatasource(ds);
    const h = await startAgent(fake, {
      stateDir: join(dir.path, 'seeds'),
      nocloudHttp: ds.agentOptions,
      beforeStart: listener.beforeStart,
      reportPlan: progressReportPlanner({
        enabled: true,
        datasource: { keyring: ds.keyring, baseUrl: GUEST_BASE_URL },
      }),
      annotateVmis: { minIntervalMs: 50, sweepMs: 50 },
    });
    // The harness logs at debug; trace from here on, before any VMI exists.
    h.logger.level = 'trace';
    const http = await startHttpServer({
      listen: '127.0.0.1:0',
      metrics: h.metrics,
      status: h.agent.status,
      logger: h.logger,
    });
    t.after(async () => {
      await http.close();
      await listener.close();
      await h.stop();
    });
    const base = listener.baseUrl;
    const get = async (path: string, init?: RequestInit) => {
      const r = await fetch(`${base}/${path}`, init);
      return { status: r.status, body: await r.text() };
    };

    // The VMI, admitted (serial written) with the UID the API server will give it.
    const uid = randomUUID();
    const template = launcherOf(vmi('vm-all', { namespace: NS, cloudInit: 'secretRef: {name: ud}\n' }), POD);
    template.metadata.uid = uid;
    template.metadata.annotations![GATE_ANNOTATION] = 'false';
    const admitted = admitWithSerial(template);
    const serial = admitted.spec.domain?.firmware?.serial;
    const serialToken = serialTokenOf(serial);
    const uidToken = ds.keyring.sign(uid);
    assert.notEqual(serialToken, uidToken);

    // The guest boots before the agent has its seed: both tokens miss first.
    assert.equal((await get(`${uidToken}/meta-data`)).status, 404);
    assert.equal((await get(`${serialToken}/meta-data`)).status, 404);

    applied.set(`${NS}/vm-all`, { ...admitted.metadata.labels, ...admitted.metadata.annotations });
    assert.equal(fake.applyVmi(admitted).metadata.uid, uid);
    const other = launcherOf(vmi('vm-other', { namespace: NS }), POD_OTHER);
    applied.set(`${NS}/vm-other`, { ...other.metadata.labels, ...other.metadata.annotations });
    const otherUid = fake.applyVmi(other).metadata.uid!;

    // Served by either token; the user-data is the Secret's.
    const ud = await waitFor('vm-all served', async () => {
      const r = await get(`${uidToken}/user-data`);
      return r.status === 200 ? r.body : undefined;
    }).catch((e: Error) => {
      // Why not, when it is not: the VMI's state and the last log lines.
      const state = JSON.stringify(h.agent.status.get(`${NS}/vm-all`));
      throw new Error(`${e.message}: ${state}\n${[...h.lines, ...dsLog.lines].slice(-20).join('\n')}`);
    });
    assert.ok(ud.includes(marker), 'the Secret was read into the seed');
    assert.equal((await get(`${uidToken}/meta-data`)).status, 200);
    for (const f of ['meta-data', 'user-data']) assert.equal((await get(`${serialToken}/${f}`)).status, 200, f);
    const vendorData = await get(`${serialToken}/vendor-data`);
    assert.equal(vendorData.status, 200);

    // The report token, as the guest has it: from its vendor-data.
    const endpoint = /endpoint: "([^"]+)"/.exec(vendorData.body)?.[1];
    const reportTok = new RegExp(`^${GUEST_BASE_URL}/([A-Za-z0-9_-]{43})/cloud-init-events$`).exec(endpoint ?? '')?.[1];
    assert.ok(reportTok, vendorData.body);
    assert.equal(reportTok, reportToken(ds.keyring, uid));
    for (const e of SUCCESS) {
      const r = await get(`${reportTok}/cloud-init-events`, { method: 'POST', body: JSON.stringify(e) });
      assert.equal(r.status, 200, r.body);
    }
    const bad = await get(`${reportTok}/cloud-init-events`, { method: 'POST', body: `{"token":"${reportTok}"` });
    assert.ok(bad.status >= 400 && bad.status < 500, `a malformed report: ${bad.status}`);

    // The ServiceAccount token, by the serial token; the other pod's refused.
    const MD = { headers: { Metadata: 'true' } };
    const tokenReply = await get(`${serialToken}/token`, MD);
    assert.equal(tokenReply.status, 200, tokenReply.body);
    assert.equal((JSON.parse(tokenReply.body) as { token: string }).token, sa);
    assert.equal((await get(`${uidToken}/identity`, MD)).status, 200);
    // An IMDS session: issued, used, and refused for another VMI.
    // A connection of its own: the PUT must open one (fetch would reuse the pool's).
    const put = await httpGet(
      Number(new URL(base).port),
      `/v1/${serialToken}/session`,
      {
        'X-Vmseed-Session-Ttl-Seconds': '60',
      },
      '127.0.0.1',
      'PUT',
    );
    assert.equal(put.status, 200, put.body);
    const sessionToken = put.body;
    const withSession = { headers: { Metadata: 'true', 'X-Vmseed-Session': sessionToken } };
    assert.equal((await get(`${uidToken}/identity`, withSession)).status, 200);
    const otherToken = await waitFor('vm-other served', async () => {
      const r = await get(`${ds.keyring.sign(otherUid)}/token`, MD);
      return r.status !== 500 && (await get(`${ds.keyring.sign(otherUid)}/meta-data`)).status === 200 && r;
    });
    assert.equal(otherToken.status, 404, 'a token naming another namespace is refused');
    assert.equal((await get(`${ds.keyring.sign(otherUid)}/identity`, withSession)).status, 401, 'a replayed session');

    // What the flow leaves: the Events and the summary on the VMI.
    await waitFor('SeedReady and ProvisioningSucceeded Events', () =>
      ['SeedReady', 'ProvisioningSucceeded'].every((reason) =>
        fake.events().some((e) => e.involvedObject.name === 'vm-all' && e.reason === reason),
      ),
    );
    const summary = await waitFor('the provisioning annotation', () => {
      const text = fake.getVmi(NS, 'vm-all')?.metadata.annotations?.[PROVISIONING_ANNOTATION];
      const parsed = text === undefined ? undefined : (JSON.parse(text) as ProvisioningSummary);
      return parsed?.state === 'succeeded' && parsed;
    });
    assert.equal(summary.result, 'SUCCESS');
    await waitFor('fetches on status.json', () => h.agent.status.get(`${NS}/vm-all`)?.lastFetch?.['vendor-data']);

    // ---- the sinks, each checked to be there and to hold the flow ----
    const routes = await fetchAll(http.url);
    const route = (p: string) => routes.find((r) => r.path === p);
    const metricsText = `${route('/metrics')?.body ?? ''}\n${await dsMetrics.registry.metrics()}`;
    assert.match(metricsText, /vmseed_seed_generation_duration_seconds_count\{[^}]*\} [1-9]/, 'agent metrics');
    assert.match(metricsText, /vmseed_datasource_requests_total\{[^}]*status="200"\} [1-9]/, 'datasource metrics');
    assert.match(metricsText, /vmseed_provisioning_seconds_count\{result="success"\} 1/, 'report metrics');
    const pages = routes.filter((r) => r.path.startsWith('/status') && !r.path.startsWith('/status.json'));
    const jsons = routes.filter((r) => r.path.startsWith('/status.json'));
    for (const [p, name] of [
      ['/status', 'vm-all'],
      [`/status/${NS}/vm-all`, 'vm-all'],
      [`/status/${NS}/vm-other`, 'vm-other'],
    ]) {
      assert.equal(route(p)?.status, 200, p);
      assert.ok(route(p)!.body.includes(`${NS}/${name}`), `${p} shows ${name}`);
    }
    assert.match(route(`/status/${NS}/vm-all`)!.body, /data-provisioning="succeeded"/);
    const json = JSON.parse(route('/status.json')!.body) as {
      vmis: Array<{ name: string; servedOverHttp?: boolean; provisioning?: { state: string } }>;
    };
    const all = json.vmis.find((v) => v.name === 'vm-all');
    assert.ok(all?.servedOverHttp && all.provisioning?.state === 'succeeded', JSON.stringify(all));
    const logLines = [...h.lines, ...dsLog.lines];
    assert.ok(h.logger.isLevelEnabled('trace') && dsLog.logger.isLevelEnabled('trace'), 'logged at trace level');
    const mentions = (lines: string[], msg: RegExp) => lines.some((l) => l.includes('"name":"vm-all"') && msg.test(l));
    assert.ok(mentions(dsLog.lines, /served seed file/), 'the datasource logged the fetches');
    assert.ok(mentions(h.lines, /./), 'the agent logged the VMI');
    // Nothing in src/ logs at trace (no .trace( call) yet: the trace-level
    // capture holds the debug lines and up. Any trace line is searched too.
    const levels = new Set(logLines.map((l) => (JSON.parse(l) as { level: number }).level));
    assert.ok(levels.has(20), `debug lines captured (levels ${[...levels].join(', ')})`);
    const events = [...written.events, JSON.stringify(fake.events())];
    for (const reason of ['SeedReady', 'ProvisioningSucceeded'])
      assert.ok(
        events.some((e) => e.includes(`"reason":"${reason}"`)),
        `${reason} Events captured`,
      );
    assert.ok(written.patches >= 1, 'annotation patches received');
    assert.ok(
      written.annotations.some((a) => PROVISIONING_ANNOTATION in a),
      `the agent's annotation captured: ${JSON.stringify(written.annotations)}`,
    );

    // ---- the secrets ----
    const secrets: Array<{ what: string; value: string | Buffer }> = [
      ...keys.map((k, i) => ({ what: `datasource key ${i + 1}`, value: Buffer.from(k) })),
      ...ds.keyring.acceptedTokens(uid).map((tok, i) => ({ what: `UID token (key ${i + 1})`, value: tok })),
      { what: 'serial token', value: serialToken },
      { what: 'serial', value: serial! },
      { what: 'report token', value: reportTok },
      { what: 'report URL', value: endpoint! },
      { what: 'ServiceAccount token', value: sa },
      { what: 'IMDS session token', value: sessionToken },
      { what: 'ServiceAccount token payload', value: sa.split('.')[1] },
      { what: 'ServiceAccount token signature', value: sa.split('.')[2] },
      { what: "the other pod's ServiceAccount token", value: saForeign },
      { what: "the other pod's token signature", value: saForeign.split('.')[2] },
      { what: "the other VMI's UID token", value: ds.keyring.sign(otherUid) },
      { what: "the other VMI's report token", value: reportToken(ds.keyring, otherUid) },
      { what: 'user-data (Secret value)', value: userData },
      { what: 'user-data marker', value: marker },
    ];
    const sinks: Array<{ sink: string; texts: Array<{ where: string; text: string }> }> = [
      { sink: 'log', texts: logLines.map((l, i) => ({ where: `log line ${i}`, text: l })) },
      { sink: 'metrics', texts: [{ where: '/metrics and the datasource metrics', text: metricsText }] },
      {
        sink: 'pages',
        texts: pages.map((r) => ({ where: r.path, text: `${JSON.stringify(r.headers)}\n${r.body}` })),
      },
      {
        sink: 'status.json',
        texts: jsons.map((r) => ({ where: r.path, text: `${JSON.stringify(r.headers)}\n${r.body}` })),
      },
      { sink: 'Events', texts: events.map((e, i) => ({ where: `Event snapshot ${i}`, text: e })) },
      {
        sink: 'annotations',
        texts: written.annotations.map((a, i) => ({ where: `VMI patch ${i}`, text: JSON.stringify(a) })),
      },
    ];
    for (const { sink, texts } of sinks) assert.ok(texts.length > 0 && texts.some((x) => x.text.length > 0), sink);
    // Every finding, every sink: one failure lists them all.
    const leaks: string[] = [];
    for (const s of secrets) {
      const forms = secretForms(s.value);
      for (const { sink, texts } of sinks)
        for (const x of texts) {
          const found = findSecret(x.text, forms);
          if (found === undefined) continue;
          const around = x.text.slice(Math.max(0, found.at - 100), found.at + 60);
          leaks.push(`${sink}: ${x.where} carries the ${s.what} (${found.form}): …${around}…`);
        }
    }
    for (const { sink, texts } of sinks)
      for (const x of texts)
        if (/ds=nocloud(-net)?;s=/.test(x.text)) leaks.push(`${sink}: ${x.where} carries a serial`);
    assert.deepEqual(leaks, []);
  },
);
