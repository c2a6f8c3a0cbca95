// The image reference is set in one place per variant: the `images:` entry
// of its kustomization, which `kustomize edit set image` rewrites. Every
// container of the rendered variant (init container, agent, redirect
// sidecar, the cluster component) must take it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as yaml from 'js-yaml';
import { ROOT, findObject, type KubeObject } from '../support/manifests.ts';
import { OVERLAYS, kustomize } from '../support/kustomize.ts';

const IMAGE = 'ghcr.io/vmseed/vmseed';

interface Kustomization {
  images?: { name: string; newName?: string; newTag?: string }[];
}

type PodTemplate = {
  spec: { template: { spec: { containers: { image: string }[]; initContainers?: { image: string }[] } } };
};

// Every kustomize variant in deploy/: the overlays the other deploy tests
// render, and deploy/webhook (cert-manager kinds; test/deploy/webhook-overlay.test.ts).
const VARIANTS = [...OVERLAYS, 'webhook'] as const;

// The images of the DaemonSet's and of the cluster component's containers.
function imagesOf(objects: KubeObject[]): string[] {
  const pods = objects
    .filter((o) => o.kind === 'DaemonSet' || o.kind === 'Deployment')
    .map((o) => (o as unknown as PodTemplate).spec.template.spec);
  assert.ok(findObject(objects, 'DaemonSet'));
  return pods.flatMap((spec) => [...(spec.initContainers ?? []), ...spec.containers].map((c) => c.image));
}

test('every variant names the image once, in images:, at the package version', { timeout: 120_000 }, async () => {
  const version = (JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
  for (const o of VARIANTS) {
    const k = yaml.load(await readFile(join(ROOT, 'deploy', o, 'kustomization.yaml'), 'utf8')) as Kustomization;
    assert.deepEqual(k.images, [{ name: IMAGE, newName: IMAGE, newTag: version }], o);
    const images = imagesOf(await kustomize(join(ROOT, 'deploy', o)));
    assert.ok(images.length >= 2, o);
    for (const image of images) assert.equal(image, `${IMAGE}:${version}`, o);
  }
});

// What `kustomize edit set image ghcr.io/vmseed/vmseed=<ref>` writes: the
// entry's newName and newTag (kubectl carries no `kustomize edit`).
test('a reference set in images: reaches every container of every variant', { timeout: 120_000 }, async () => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-images-'));
  try {
    // One untouched tree per variant: a variant built on another (imds and
    // namespaced on kubevirt) must take its own entry, whatever its base's.
    for (const o of VARIANTS) {
      await rm(join(dir, 'deploy'), { recursive: true, force: true });
      await cp(join(ROOT, 'manifests'), join(dir, 'manifests'), { recursive: true });
      await cp(join(ROOT, 'deploy'), join(dir, 'deploy'), { recursive: true });
      const file = join(dir, 'deploy', o, 'kustomization.yaml');
      const k = yaml.load(await readFile(file, 'utf8')) as Kustomization;
      k.images = [{ name: IMAGE, newName: 'registry.example:5000/ops/vmseed', newTag: `test-${o}` }];
      await writeFile(file, yaml.dump(k));
      const images = imagesOf(await kustomize(join(dir, 'deploy', o)));
      for (const image of images) assert.equal(image, `registry.example:5000/ops/vmseed:test-${o}`, o);
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

// How an operator points a variant at their image: the docs show the
// command for the entry the variants have, for the image they just built and
// pushed (the manifests' name is not an image anyone can pull).
test('the README, docs/install.md and docs/operations.md build and push the image, then `kustomize edit set image` it', async () => {
  for (const doc of ['README.md', 'docs/install.md', 'docs/operations.md']) {
    const text = await readFile(join(ROOT, doc), 'utf8');
    const set = new RegExp(`^kustomize edit set image ${IMAGE.replaceAll('.', '\\.')}=(\\S+:\\S+)$`, 'm').exec(text);
    assert.ok(set, doc);
    const built = text.indexOf(`podman build -t ${set[1]} .`);
    const pushed = text.indexOf(`podman push ${set[1]}\n`);
    assert.ok(built >= 0 && built < pushed && pushed < set.index, `${doc}: build and push ${set[1]} first`);
  }
});
