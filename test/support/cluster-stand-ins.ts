// What other parts of a cluster do to an install, for tests that have only
// the fake API server (fake-kube.ts) and a pod of the kubelet stand-in
// (kubelet.ts): cert-manager issuing the certificates the manifests ask
// for and injecting their CA, the API server calling a mutating webhook,
// Prometheus scraping what a ServiceMonitor selects.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { FakeKube } from './fake-kube.ts';
import { resourceType, type StoredObject } from './fake-kube-objects.ts';
import type { DaemonSetPod } from './kubelet.ts';

const run = promisify(execFile);
type Any = any;

const stored = (fake: FakeKube, kind: string) => fake.objects.all().filter((o) => o.kind === kind) as Any[];

// cert-manager with the selfSigned Issuer the manifests ship: for each
// Certificate, a self-signed certificate for its dnsNames with its key
// algorithm, stored as its secretName (tls.crt, tls.key, ca.crt: the
// certificate itself); then the CA injector: the caBundle of every webhook
// configuration annotated cert-manager.io/inject-ca-from that Certificate.
export async function certManager(fake: FakeKube): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-cert-manager-'));
  try {
    for (const cert of stored(fake, 'Certificate')) {
      const { namespace, name } = cert.metadata;
      const issuer = fake.objects.get(resourceType('cert-manager.io', 'issuers')!, namespace, cert.spec.issuerRef.name);
      assert.ok((issuer as Any)?.spec?.selfSigned, `Certificate ${name}: its Issuer is selfSigned`);
      assert.deepEqual(
        [cert.spec.privateKey.algorithm, cert.spec.privateKey.size],
        ['ECDSA', 256],
        'the key the Certificate asks for',
      );
      const [key, crt] = [join(dir, `${name}.key`), join(dir, `${name}.crt`)];
      const sans = (cert.spec.dnsNames as string[]).map((n) => `DNS:${n}`).join(',');
      await run('openssl', [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-keyout',
        key,
        '-out',
        crt,
        '-days',
        '2',
        '-subj',
        '/',
        '-addext',
        `subjectAltName=critical,${sans}`,
      ]);
      const pem = await readFile(crt, 'utf8');
      fake.setSecret({
        metadata: { name: cert.spec.secretName, namespace },
        type: 'kubernetes.io/tls',
        stringData: { 'tls.crt': pem, 'tls.key': await readFile(key, 'utf8'), 'ca.crt': pem },
      });
      const type = resourceType('admissionregistration.k8s.io', 'mutatingwebhookconfigurations')!;
      for (const mwc of stored(fake, 'MutatingWebhookConfiguration')) {
        if (mwc.metadata.annotations?.['cert-manager.io/inject-ca-from'] !== `${namespace}/${name}`) continue;
        for (const w of mwc.webhooks) w.clientConfig.caBundle = Buffer.from(pem).toString('base64');
        fake.objects.replace(type, mwc as StoredObject);
      }
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

// The Service's port → its targetPort on the pod's container, as the
// endpoints controller resolves a named target port; the Service must
// select the pod.
function servicePort(fake: FakeKube, pod: DaemonSetPod, ref: { namespace: string; name: string }, port: Any): number {
  const svc = fake.objects.get(resourceType('', 'services')!, ref.namespace, ref.name) as Any;
  assert.ok(svc, `Service ${ref.namespace}/${ref.name}`);
  for (const [k, v] of Object.entries(svc.spec.selector ?? {}))
    assert.equal(pod.labels[k], v, `Service ${ref.name} selects the pod (${k})`);
  const sp = (svc.spec.ports as Any[]).find((p) => p.port === port || p.name === port);
  assert.ok(sp, `Service ${ref.name} has port ${port}`);
  for (const c of pod.spec.containers as Any[])
    for (const p of (c.ports ?? []) as Any[])
      if (p.name === sp.targetPort || p.containerPort === sp.targetPort) return p.containerPort;
  throw new Error(`Service ${ref.name} port ${port}: targetPort ${sp.targetPort} is no container port of the pod`);
}

// The API server calling the first webhook of the stored configuration for
// an AdmissionReview: through its Service to the pod, TLS checked against
// the configuration's caBundle and the Service's DNS name. The answer's
// JSON, with the HTTP status as `status`.
export async function callWebhook(fake: FakeKube, pod: DaemonSetPod, review: unknown): Promise<Any> {
  const hook = stored(fake, 'MutatingWebhookConfiguration')[0].webhooks[0];
  const ref = hook.clientConfig.service;
  const port = servicePort(fake, pod, ref, ref.port ?? 443);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: pod.podIP,
        port,
        path: ref.path,
        method: 'POST',
        servername: `${ref.name}.${ref.namespace}.svc`,
        ca: Buffer.from(hook.clientConfig.caBundle ?? '', 'base64').toString(),
        headers: { 'content-type': 'application/json' },
        agent: false,
        timeout: (hook.timeoutSeconds ?? 10) * 1000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          try {
            resolve({ status: res.statusCode, ...JSON.parse(Buffer.concat(chunks).toString()) });
          } catch (e) {
            reject(e);
          }
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error('webhook call timed out')));
    req.on('error', reject);
    req.end(JSON.stringify(review));
  });
}

// Prometheus with the stored ServiceMonitors: each endpoint whose port the
// selected Service has is scraped on the pod at its targetPort. Returns
// the scrape bodies by endpoint port name (endpoints naming a port the
// Service does not have find no target, as in Prometheus).
export async function scrape(fake: FakeKube, pod: DaemonSetPod): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const sm of stored(fake, 'ServiceMonitor')) {
    const namespaces: string[] = sm.spec.namespaceSelector?.matchNames ?? [sm.metadata.namespace];
    const services = fake.objects
      .all()
      .filter((o) => o.kind === 'Service' && namespaces.includes(o.metadata.namespace!))
      .filter((o) =>
        Object.entries(sm.spec.selector.matchLabels ?? {}).every(([k, v]) => (o.metadata as Any).labels?.[k] === v),
      ) as Any[];
    assert.ok(services.length > 0, `ServiceMonitor ${sm.metadata.name} selects a Service`);
    for (const svc of services)
      for (const ep of sm.spec.endpoints as Any[]) {
        if (!(svc.spec.ports as Any[]).some((p) => p.name === ep.port)) continue;
        const port = servicePort(fake, pod, svc.metadata, ep.port);
        const r = await fetch(`http://${pod.podIP}:${port}${ep.path ?? '/metrics'}`, {
          signal: AbortSignal.timeout(10_000),
        });
        assert.equal(r.status, 200, `scrape of ${ep.port}`);
        out.set(ep.port, await r.text());
      }
  }
  return out;
}
