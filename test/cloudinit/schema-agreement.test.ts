// vmseed's schema check against cloud-init's own: for every cloud-config and
// network-config of the corpus, the paths each release's real cloud-init
// reports as errors and as deprecations (test/support/cloud-init-schema-oracle.ts
// runs the release's validate_cloudconfig_file, what `cloud-init schema
// --config-file` runs) must equal what checkSchemas reports, with the same
// schema files (scripts/fetch-cloud-init-schemas.sh, run by setup-host.sh).
import '../support/schema-files.ts';
import assert from 'node:assert/strict';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, test } from 'node:test';
import { checkSchemas, type SchemaReport } from '../../src/cloudinit/schema/check.ts';
import { CLOUD_INIT_RELEASES, DEFAULT_SCHEMA_DIR, schemaStore } from '../../src/cloudinit/schema/schema-store.ts';
import { runSchemaOracle, type OracleResult } from '../support/cloud-init-schema-oracle.ts';

const here = path.dirname(new URL(import.meta.url).pathname);
const CORPUS = path.join(here, '..', 'fixtures', 'cloud-config-corpus');
const NETWORK = path.join(here, '..', 'fixtures', 'network-config-corpus');

async function files(dir: string): Promise<string[]> {
  return (await readdir(dir)).filter((f) => f.endsWith('.yaml')).map((f) => path.join(dir, f));
}

function paths(r: SchemaReport, severity: 'error' | 'deprecation'): string[] {
  return [...new Set(r.problems.filter((p) => p.severity === severity).map((p) => p.path))].sort();
}

function oraclePaths(o: OracleResult, severity: 'error' | 'deprecation'): string[] {
  const list = severity === 'error' ? o.errors : o.deprecations;
  // A header or YAML problem (format-l1.c1) is user-data-lint's to report, not the schema's.
  return [...new Set(list.map((p) => p.path).filter((p) => !p.startsWith('format-l')))].sort();
}

// vmseed cuts a quoted value at 80 characters ("..."); the rest of the
// message is cloud-init's, word for word.
function sameMessage(ours: string, theirs: string): boolean {
  let at = 0;
  for (const piece of ours.split('...')) {
    const i = theirs.indexOf(piece, at);
    if (i < 0) return false;
    at = i + piece.length;
  }
  return ours.includes('...') || ours === theirs;
}

describe('schema check agrees with cloud-init schema --config-file', { timeout: 180_000 }, () => {
  test('the schema files setup-host.sh fetched are there for every release', () => {
    for (const s of schemaStore(DEFAULT_SCHEMA_DIR).status())
      assert.equal(s.state, 'ready', `${s.release}: ${s.state === 'off' ? s.reason : ''}`);
  });

  for (const release of CLOUD_INIT_RELEASES) {
    test(`cloud-init ${release}: cloud-config corpus and network-config corpus`, async () => {
      const cc = await files(CORPUS);
      const nc = release === '22.4' ? [] : await files(NETWORK);
      assert.ok(cc.length >= 60, `corpus has ${cc.length} cloud-configs`);
      const oracle = await runSchemaOracle(release, [
        ...cc.map((p) => ({ path: p, type: 'cloud-config' as const })),
        ...nc.map((p) => ({ path: p, type: 'network-config' as const })),
      ]);
      const mismatches: string[] = [];
      let withErrors = 0;
      let withDeprecations = 0;
      for (const file of [...cc, ...nc]) {
        const o = oracle.get(file);
        assert.ok(o, `oracle has no result for ${file}`);
        const bytes = new Uint8Array(await readFile(file));
        const network = nc.includes(file);
        const r = checkSchemas({
          dir: DEFAULT_SCHEMA_DIR,
          release,
          reveal: true,
          ...(network ? { networkConfig: bytes } : { userData: bytes }),
        });
        for (const severity of ['error', 'deprecation'] as const) {
          const want = o.exception || o.skipped ? [] : oraclePaths(o, severity);
          const got = paths(r, severity);
          if (JSON.stringify(want) !== JSON.stringify(got))
            mismatches.push(
              `${path.basename(file)} ${severity}: cloud-init ${JSON.stringify(want)}, vmseed ${JSON.stringify(got)}`,
            );
        }
        for (const [severity, list] of [
          ['error', o.errors],
          ['deprecation', o.deprecations],
        ] as const)
          for (const p of list.filter((x) => !x.path.startsWith('format-l')))
            if (
              !r.problems.some((m) => m.severity === severity && m.path === p.path && sameMessage(m.message, p.message))
            )
              mismatches.push(
                `${path.basename(file)} ${severity} ${p.path}: no vmseed message like ${JSON.stringify(p.message)}`,
              );
        if (oraclePaths(o, 'error').length > 0) withErrors++;
        if (oraclePaths(o, 'deprecation').length > 0) withDeprecations++;
      }
      assert.deepEqual(mismatches, []);
      // The corpus exercises both kinds of finding, so agreement is not agreement on "nothing".
      assert.ok(withErrors >= 15, `${withErrors} files with errors`);
      assert.ok(withDeprecations >= 3, `${withDeprecations} files with deprecations`);
    });
  }
});
