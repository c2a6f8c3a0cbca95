// One place that parses YAML for src/cloudinit, so every caller reports errors
// the same way: 1-based line and column plus the parser's reason, never the
// source snippet (it would quote user-data or Secret content into Events).
import { loadAll, YAMLException } from 'js-yaml';

export type YamlResult<T> = { ok: true; value: T } | { ok: false; line?: number; column?: number; reason: string };

export interface YamlOptions {
  // PyYAML (cloud-init) lets a later duplicate key win; js-yaml rejects it unless asked.
  allowDuplicateKeys?: boolean;
}

// Some js-yaml reasons quote the input (tag names, alias names); keep only
// the fixed part so no user data reaches an Event.
function safeReason(reason: string): string {
  return reason.replace(/\s*(?:!<|"|'|:\s).*$/s, '').slice(0, 120) || 'syntax error';
}

function failure(e: unknown): { ok: false; line?: number; column?: number; reason: string } {
  if (e instanceof YAMLException) {
    const m = e.mark;
    const reason = safeReason(e.reason);
    return m ? { ok: false, line: m.line + 1, column: m.column + 1, reason } : { ok: false, reason };
  }
  throw e;
}

export function parseYaml(text: string, options: YamlOptions = {}): YamlResult<unknown> {
  try {
    // An empty or comment-only document is null in PyYAML; js-yaml's load throws.
    const docs = loadAll(text, { json: options.allowDuplicateKeys === true });
    if (docs.length > 1) return { ok: false, reason: 'expected a single YAML document but found several ("---")' };
    return { ok: true, value: docs.length === 0 ? null : docs[0] };
  } catch (e) {
    return failure(e);
  }
}

export function parseYamlAll(text: string): YamlResult<unknown[]> {
  try {
    return { ok: true, value: loadAll(text) };
  } catch (e) {
    return failure(e);
  }
}

export function where(r: { line?: number; column?: number }): string {
  return r.line !== undefined ? `line ${r.line}, column ${r.column}` : 'unknown position';
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
