// The layer order of src/ (docs: design "Shape of the code"): every import,
// `import type` and dynamic import() included, goes down the list below or
// stays in its own folder. Folders of one layer do not import each other:
// at the time this test was written none did, so any such import is new and
// needs a place in the order first.
//
// The Kubernetes object types (VmiObject, SecretObject, RefResolver, ...)
// are src/api/objects.ts at the bottom: the pure cloudinit/ renders from them
// and kube/, a layer above it, fills them, so both import them downwards.
// The status record's shapes (src/status/snapshot.ts) sit below every folder
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
// The node agent (agent/) and the cluster component (cluster/) are one
// layer: neither imports the other, and both stand on the shared layers.
// The datasource stands on the node's services (it reads nothing of the
// agent but the contracts in datasource/types.ts, which the agent fills).
const LAYERS: ReadonlyArray<readonly string[]> = [
  ['main.ts'],
  ['commands'],
  ['config'],
  ['agent', 'cluster'],
  ['datasource'],
  ['kube', 'libvirt', 'http', 'disk', 'redirect'],
  ['cloudinit'],
  ['status'],
  ['errors.ts', 'metrics', 'core', 'api'],
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
  assert.equal(violation({ from: 'agent/reconciler.ts', to: 'kube/api-client.ts' }), undefined);
  assert.equal(violation({ from: 'cloudinit/render.ts', to: 'api/objects.ts' }), undefined);
  assert.equal(violation({ from: 'kube/kube-vmi-source.ts', to: 'kube/watch.ts' }), undefined);
  assert.equal(violation({ from: 'cloudinit/render.ts', to: 'kube/api-client.ts' }), 'kube is above cloudinit');
  assert.equal(
    violation({ from: 'http/status-server.ts', to: 'libvirt/libvirt-client.ts' }),
    'http and libvirt are one layer: neither imports the other',
  );
  assert.equal(
    violation({ from: 'errors.ts', to: 'core/format.ts' }),
    'errors.ts and core are one layer: neither imports the other',
  );
  assert.equal(violation({ from: 'agent/controller.ts', to: 'somewhere/x.ts' }), 'somewhere is in no layer');
});

test('cloudinit/ reaches no filesystem, network, process or thread', () => {
  const impure = sourceFiles(join(SRC, 'cloudinit')).flatMap((f) =>
    importsOf(f)
      .filter((s) => IMPURE.test(s))
      .map((s) => `${f} imports ${s}`),
  );
  assert.deepEqual(impure, []);
});

// Import cycles between files, value or type: each strongly connected
// group of more than one file (Tarjan), its files sorted.
function cycles(edges: readonly Edge[]): string[][] {
  const next = new Map<string, string[]>();
  for (const e of edges) next.set(e.from, [...(next.get(e.from) ?? []), e.to]);
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    onStack.add(v);
    for (const w of next.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const group: string[] = [];
    let w: string;
    do {
      w = stack.pop()!;
      onStack.delete(w);
      group.push(w);
    } while (w !== v);
    if (group.length > 1) found.push(group.sort());
  };
  for (const v of next.keys()) if (!index.has(v)) visit(v);
  return found;
}

test('no import cycle between the files of src/, types included', () => {
  assert.deepEqual(
    cycles(internalEdges()).map((c) => c.join(' -> ')),
    [],
  );
});

test('the cycle finder: a loop through three files is one cycle, a chain none', () => {
  const e = (from: string, to: string): Edge => ({ from, to });
  assert.deepEqual(cycles([e('a', 'b'), e('b', 'c'), e('c', 'a'), e('c', 'd')]), [['a', 'b', 'c']]);
  assert.deepEqual(cycles([e('a', 'b'), e('b', 'c')]), []);
  assert.deepEqual(cycles([e('a', 'b'), e('b', 'a'), e('x', 'y'), e('y', 'x')]), [
    ['a', 'b'],
    ['x', 'y'],
  ]);
});

test('no two files of src/ share a basename', () => {
  const byName = new Map<string, string[]>();
  for (const f of sourceFiles(SRC)) {
    const name = f.split('/').pop()!;
    byName.set(name, [...(byName.get(name) ?? []), f]);
  }
  assert.deepEqual(
    [...byName.values()].filter((fs) => fs.length > 1),
    [],
  );
});
