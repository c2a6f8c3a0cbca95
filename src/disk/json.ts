// Meta-data serialisation shared by both layouts. The same Seed must give the
// same bytes (the image hash identifies a seed), whatever order its keys were
// built in, so object keys are sorted recursively (arrays keep their order).
// Two-space indentation and a final newline: readable with `vmseed inspect
// --cat`, and valid YAML for NoCloud's `meta-data`.
const enc = new TextEncoder();

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v !== null && typeof v === 'object') {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) out[k] = sortKeys((v as Record<string, unknown>)[k]);
    return out;
  }
  return v;
}

export function stableJson(value: unknown): string {
  return JSON.stringify(sortKeys(value), null, 2) + '\n';
}

export function stableJsonBytes(value: unknown): Uint8Array {
  return enc.encode(stableJson(value));
}
