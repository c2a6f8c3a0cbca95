// cloud-init's schema files as Debian packages them, laid out by
// scripts/fetch-cloud-init-schemas.sh: <dir>/<release>/release.json and the
// release's schema-*.json. Read and compiled on first use, once per thread
// (a render worker has its own): compiling a release's cloud-config schema
// and its first check take a few hundred milliseconds and some 20 MB, which
// a node whose VMIs never ask for that release should not pay. The files are
// read through SchemaFiles, which each process's entry point installs
// (src/main.ts, the render worker): cloudinit/ itself reaches no filesystem.
import path from 'node:path';
import { compileCloudInitSchema, type CiProfile, type CiValidator } from './ci-validator.ts';

/** The releases vmseed reproduces cloud-init's validator for (ci-validator.ts). */
export const CLOUD_INIT_RELEASES: readonly CiProfile[] = ['22.4', '25.1'];
/** The release a VMI is checked against without the annotation: Debian 13's. */
export const DEFAULT_CLOUD_INIT_RELEASE: CiProfile = '25.1';
/** Where setup-host.sh and the image put the schema files. */
export const DEFAULT_SCHEMA_DIR = '/usr/share/vmseed/cloud-init-schemas';

/** A schema file of a release: what a document is checked against. */
export type SchemaFile = 'cloud-config' | 'network-config-v1' | 'network-config-v2';

const FILES: Record<SchemaFile, string> = {
  'cloud-config': 'schema-cloud-config-v1.json',
  'network-config-v1': 'schema-network-config-v1.json',
  'network-config-v2': 'schema-network-config-v2.json',
};

// The largest schema file read: 25.1's cloud-config schema is 150 KB.
const MAX_SCHEMA_BYTES = 4 * 1024 * 1024;

/** Whether a release can be checked against, and why not. */
export type ReleaseStatus =
  | { release: CiProfile; state: 'ready'; version: string; files: SchemaFile[] }
  | { release: CiProfile; state: 'off'; reason: string };

/** A release's compiled validator, or why there is none (the file is missing or not JSON). */
export type SchemaLookup = { ok: true; validator: CiValidator } | { ok: false; reason: string };

/** How a store reads a file: whole, as text, refused past `maxBytes`; throws with the reason (an errno `code`, or a message). */
export interface SchemaFiles {
  read(file: string, maxBytes: number): string;
}

const UNREADABLE: SchemaFiles = {
  read() {
    throw new Error('not readable: this process installed no SchemaFiles (installSchemaFiles)');
  },
};

let installed: SchemaFiles = UNREADABLE;
const stores = new Map<string, SchemaStore>();

/** Sets how this thread's stores read schema files; forgets the stores made before. */
export function installSchemaFiles(files: SchemaFiles): void {
  installed = files;
  stores.clear();
}

function why(e: unknown): string {
  const code = (e as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return 'missing';
  if (code === 'EACCES') return 'not readable';
  return e instanceof SyntaxError ? 'not valid JSON' : e instanceof Error ? e.message : String(e);
}

/** One directory of releases; `status()` reads only the release.json files. */
export class SchemaStore {
  readonly dir: string;
  readonly #files: SchemaFiles;
  readonly #compiled = new Map<string, SchemaLookup>();
  readonly #warm = new Set<CiProfile>();

  constructor(dir: string, files: SchemaFiles = installed) {
    this.dir = dir;
    this.#files = files;
  }

  status(): ReleaseStatus[] {
    return CLOUD_INIT_RELEASES.map((release) => {
      const file = path.join(this.dir, release, 'release.json');
      try {
        const info = JSON.parse(this.#files.read(file, MAX_SCHEMA_BYTES)) as { version?: unknown; files?: unknown };
        const files = (Object.keys(FILES) as SchemaFile[]).filter(
          (f) => Array.isArray(info.files) && info.files.includes(FILES[f]),
        );
        if (!files.includes('cloud-config'))
          return { release, state: 'off', reason: `${file} lists no ${FILES['cloud-config']}` };
        return { release, state: 'ready', version: String(info.version ?? 'unknown'), files };
      } catch (e) {
        return {
          release,
          state: 'off',
          reason: `${file} is ${why(e)}; run scripts/fetch-cloud-init-schemas.sh ${this.dir}`,
        };
      }
    });
  }

  /**
   * Whether a check against `release` has run in this thread: ajv compiles a schema's parts on
   * first use, so the first check costs a few hundred milliseconds and the next ones well under one.
   */
  isWarm(release: CiProfile): boolean {
    return this.#warm.has(release);
  }

  /** Notes that a check against `release` ran (check.ts, after each walk). */
  warmed(release: CiProfile): void {
    this.#warm.add(release);
  }

  /** The compiled schema `file` of `release`; compiled once, the failure remembered too. */
  validator(release: CiProfile, file: SchemaFile): SchemaLookup {
    const key = `${release}/${file}`;
    let found = this.#compiled.get(key);
    if (!found) {
      const p = path.join(this.dir, release, FILES[file]);
      try {
        found = {
          ok: true,
          validator: compileCloudInitSchema(JSON.parse(this.#files.read(p, MAX_SCHEMA_BYTES)), release),
        };
      } catch (e) {
        found = { ok: false, reason: `${p} is ${why(e)}` };
      }
      this.#compiled.set(key, found);
    }
    return found;
  }
}

/** The process's store for `dir` (one per directory, so each schema compiles once per thread). */
export function schemaStore(dir: string): SchemaStore {
  let s = stores.get(dir);
  if (!s) {
    s = new SchemaStore(dir);
    stores.set(dir, s);
  }
  return s;
}
