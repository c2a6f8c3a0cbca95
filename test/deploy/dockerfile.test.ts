// The Dockerfile as text: hadolint's rules that matter for this image (no
// hadolint binary installs from the registries this project reaches; see
// docs/operations.md), its parsed stages, and the build context. The image
// itself is built and run in test/deploy/image.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { lintDockerfile, parseDockerfile, stagesOf } from '../support/dockerfile.ts';
import { ROOT } from '../support/manifests.ts';

const text = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');

test('the Dockerfile passes the hadolint-style rules', () => {
  assert.deepEqual(lintDockerfile(text), []);
});

test('the linter catches each rule it claims', () => {
  const bad = [
    'FROM node AS deps',
    'FROM node:latest',
    'FROM node:24-slim',
    'WORKDIR app',
    'ADD . /app',
    'COPY --from=builder /x /y',
    'RUN apt-get install libvirt-clients',
    'RUN cd /tmp && sudo true && npm install',
    'RUN apt update',
    'USER root',
    'ENTRYPOINT vmseed agent',
  ].join('\n');
  const rules = new Set(lintDockerfile(bad).map((f) => f.rule));
  for (const rule of [
    'DL3006',
    'DL3007',
    'VS001',
    'DL3000',
    'DL3020',
    'DL3022',
    'DL3014',
    'DL3015',
    'DL3009',
    'DL3003',
    'DL3004',
    'VS002',
    'DL3027',
    'DL3002',
    'DL3025',
  ]) {
    assert.ok(rules.has(rule), `${rule} not reported`);
  }
  assert.ok(
    lintDockerfile('FROM node:24.21-bookworm-slim\nENTRYPOINT ["x"]').some((f) => f.rule === 'DL3002'),
    'no USER at all',
  );
});

test('the parser joins continuations and reads stages', () => {
  const stages = stagesOf(parseDockerfile(text));
  assert.deepEqual(
    stages.map((s) => s.name),
    ['deps', 'schemas', undefined],
  );
  for (const s of stages) assert.match(s.image, /^node:24\.\d+-bookworm-slim$/, 'Node 24 slim, pinned to a minor');
  const apt = stages[2].instructions.find((i) => i.keyword === 'RUN' && i.args.includes('apt-get'))!;
  assert.match(apt.args, /^apt-get update && apt-get install .* && rm -rf \/var\/lib\/apt\/lists\/\*$/);
});

test('.dockerignore keeps the context small without hiding what the Dockerfile copies', () => {
  const ignored = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
  for (const must of ['node_modules', '.git', 'test', 'e2e']) assert.ok(ignored.includes(must), `${must} not ignored`);
  const copied = parseDockerfile(text)
    .filter((i) => i.keyword === 'COPY' && i.flags.from === undefined)
    .flatMap((i) => i.args.split(/\s+/).slice(0, -1));
  for (const src of copied) assert.ok(!ignored.includes(src.replace(/\/$/, '')), `${src} is copied but ignored`);
});
