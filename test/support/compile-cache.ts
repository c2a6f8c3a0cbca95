// Reads what Node's compile cache did, from its NODE_DEBUG_NATIVE=COMPILE_CACHE
// trace on stderr: for each TypeScript module, whether its stripped source
// came from the cache (a hit) or Node had to strip it (a miss, which loads
// Node's TypeScript stripper).
export interface TranspileTrace {
  hits: string[]; // module URLs
  misses: string[];
}

export const COMPILE_CACHE_DEBUG = { NODE_DEBUG_NATIVE: 'COMPILE_CACHE' };

export function transpileTrace(stderr: string): TranspileTrace {
  const hits: string[] = [];
  const misses: string[] = [];
  for (const line of stderr.split('\n')) {
    const hit = /^\[compile cache\] retrieving transpile cache for StrippedTypeScript (\S+?)\.\.\.success/.exec(line);
    if (hit) hits.push(hit[1]);
    const miss = /^\[compile cache\] no transpile cache for StrippedTypeScript (\S+)/.exec(line);
    if (miss) misses.push(miss[1]);
  }
  return { hits, misses };
}
