// The layer order of src/ (docs: design "Shape of the code"): every import,
// `import type` and dynamic import() included, goes down the list below or
// stays in its own folder. Folders of one layer do not import each other:
// at the time this test was written none did, so any such import is new and
// needs a place in the order first.
//
// The Kubernetes object types (VmiObject, SecretObject, RefResolver, ...)
// are src/api/types.ts at the bottom: the pure cloudinit/ renders from them
// and kube/, a layer above it, fills them, so both import them downwards.
// The status record's shapes (src/status/types.ts) sit below every folder
// that writes or shows them: agent/ computes them, kube/ reports its watch
// in them, http/ renders them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const SRC = fileURLToPath(new URL('../../src/', import.meta.url));

// Highest first. A group is a folder of src/, or a file at its root.
const LAYERS: ReadonlyArray<readonly string[]> = [
  ['main.ts'],
  ['commands', 'process-exit.ts'],
  ['config.ts'],
  ['config'],
  ['agent'],
  ['kube', 'libvirt', 'http', 'disk', 'redirect', 'webhook'],
  ['cloudinit'],
  ['status'],
  [
    'errors.ts',
    'metrics',
    'format.ts',
    'backoff.ts',
    'log-throttle.ts',
    'api',
    'datasource-challenge.ts',
    'datasource-binding.ts',
    'version.ts',
  ],
];

// What cloudinit/ must not reach: it renders from its input alone.
const IMPURE =
  /^(node:)?(fs|fs\/promises|net|http|https|http2|tls|dgram|dns|child_process|worker_threads)$|^(undici|chokidar)$/;

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => relative(SRC, join(e.parentPath, e.name)))
    .sort();
}

// Every specifier a module imports: static, `import type`, `export … from`
// and import(); TypeScript's own scanner, so comments and strings are not
// mistaken for imports.
function importsOf(file: string): string[] {
  const info = ts.preProcessFile(readFileSync(join(SRC, file), 'utf8'), true, true);
  return info.importedFiles.map((f) => f.fileName);
}

function groupOf(file: string): string {
  return file.split('/')[0];
}

function layerOf(group: string): number {
  return LAYERS.findIndex((l) => l.includes(group));
}

interface Edge {
  from: string;
  to: string;
}

// Imports between modules of src/, as paths relative to src/.
function internalEdges(): Edge[] {
  const edges: Edge[] = [];
  for (const from of sourceFiles(SRC)) {
    for (const spec of importsOf(from)) {
      if (!spec.startsWith('.')) continue;
      edges.push({ from, to: normalize(join(dirname(from), spec)) });
    }
  }
  return edges;
}

// Why an edge breaks the order, or undefined when it keeps it.
function violation(edge: Edge): string | undefined {
  const [a, b] = [groupOf(edge.from), groupOf(edge.to)];
  if (a === b) return undefined;
  const [la, lb] = [layerOf(a), layerOf(b)];
  if (la < 0 || lb < 0) return `${la < 0 ? a : b} is in no layer`;
  if (lb === la) return `${a} and ${b} are one layer: neither imports the other`;
  if (lb < la) return `${b} is above ${a}`;
  return undefined;
}

test('every module of src/ is in a layer', () => {
  const outside = [...new Set(sourceFiles(SRC).map(groupOf))].filter((g) => layerOf(g) < 0);
  assert.deepEqual(outside, [], 'put each new folder or root file in LAYERS');
});

test('imports go down the layers, or stay in their folder', () => {
  const found = internalEdges()
    .map((e) => ({ key: `${e.from} -> ${e.to}`, why: violation(e) }))
    .filter((v) => v.why !== undefined);
  assert.deepEqual(
    found.map((v) => `${v.key}: ${v.why}`),
    [],
  );
});

test('the rule itself: up, sideways and unknown are refused, down and within are not', () => {
  assert.equal(violation({ from: 'agent/reconciler.ts', to: 'kube/api.ts' }), undefined);
  assert.equal(violation({ from: 'cloudinit/render.ts', to: 'api/types.ts' }), undefined);
  assert.equal(violation({ from: 'kube/source.ts', to: 'kube/watch.ts' }), undefined);
  assert.equal(violation({ from: 'cloudinit/render.ts', to: 'kube/api.ts' }), 'kube is above cloudinit');
  assert.equal(
    violation({ from: 'http/server.ts', to: 'libvirt/client.ts' }),
    'http and libvirt are one layer: neither imports the other',
  );
  assert.equal(
    violation({ from: 'errors.ts', to: 'format.ts' }),
    'errors.ts and format.ts are one layer: neither imports the other',
  );
  assert.equal(violation({ from: 'agent/agent.ts', to: 'somewhere/x.ts' }), 'somewhere is in no layer');
});

test('cloudinit/ reaches no filesystem, network, process or thread', () => {
  const impure = sourceFiles(join(SRC, 'cloudinit')).flatMap((f) =>
    importsOf(f)
      .filter((s) => IMPURE.test(s))
      .map((s) => `${f} imports ${s}`),
  );
  assert.deepEqual(impure, []);
});
