// `vmseed warm-cache`: load every module of vmseed once, so that Node's
// compile cache (NODE_COMPILE_CACHE, which bin/vmseed sets) holds the
// stripped TypeScript and V8's code of each. A start with a warm cache never
// loads Node's TypeScript stripper, whose RSS would otherwise stay for the
// life of the agent (docs/operations.md, "The container image", gives the
// measurement). The container image runs this at build time, as the user the
// pod runs as (Node keys the cache by uid).
import { readdir } from 'node:fs/promises';
import { flushCompileCache, getCompileCacheDir } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Command, ExitCode } from './cli.ts';

/** `vmseed warm-cache --help`. */
export const WARM_CACHE_USAGE =
  "usage: vmseed warm-cache\n\nLoads every module of vmseed once so that Node's compile cache (NODE_COMPILE_CACHE,\nset by bin/vmseed) holds them; run it where the agent will run, as its user.\n";

const SRC = fileURLToPath(new URL('../', import.meta.url));

/**
 * `vmseed warm-cache`: imports every module of src/ so Node's compile cache
 * holds them. Exit 1 when the cache is off (run it through bin/vmseed).
 */
export const warmCache: Command = async (ctx): Promise<ExitCode> => {
  if (ctx.argv.includes('--help') || ctx.argv.includes('-h')) {
    ctx.stdout.write(WARM_CACHE_USAGE);
    return 0;
  }
  if (ctx.argv.length > 0) {
    ctx.stderr.write(`vmseed warm-cache: takes no arguments\n${WARM_CACHE_USAGE}`);
    return 2;
  }
  const dir = getCompileCacheDir();
  if (dir === undefined) {
    ctx.stderr.write(
      "vmseed warm-cache: Node's compile cache is off (NODE_COMPILE_CACHE is unset or cannot be used, or NODE_DISABLE_COMPILE_CACHE is set); run it through bin/vmseed\n",
    );
    return 1;
  }
  // Importing is enough: no module of src/ does work at load time. main.ts
  // is skipped: it is the entry point still awaiting this command (importing
  // it would wait for itself), and it was compiled, through the cache, first.
  const files = (await readdir(SRC, { recursive: true }))
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts') && f !== 'main.ts')
    .sort();
  for (const f of files) await import(pathToFileURL(join(SRC, f)).href);
  flushCompileCache();
  ctx.stdout.write(`compile cache: ${files.length + 1} modules of src/ and what they import, in ${dir}\n`);
  return 0;
};
