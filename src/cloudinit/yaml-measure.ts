// How big a YAML document is with its aliases expanded, without expanding
// them: on js-yaml's event stream (before objects exist) and on values
// (before they are serialised). Both stop as soon as the bound is passed, so
// their cost is bounded by the input or the bound, never by the expansion.
import { EVENT_ID, type Event } from 'js-yaml';
import { LIMITS } from './limits.ts';

const NO_RANGE = -1;

export interface EventMeasure {
  // Expanded size of each document, or why it is refused.
  verdict: 'ok' | 'over' | 'cycle' | 'aliases';
  // Top-level node of the first document, and whether construction could
  // still fail (explicit tags, an alias to no anchor) where parsing did not.
  top: 'mapping' | 'sequence' | 'scalar' | 'empty';
  needsConstruct: boolean;
  documents: number;
}

// One pass over the events: each node's size is its scalar text (+2) or the
// sum of its children (+2 per entry and its indentation), an alias adds the
// size its anchor's node had, a document over `limit` stops the pass.
export function measureEvents(events: Event[], source: string, limit: number): EventMeasure {
  const out: EventMeasure = { verdict: 'ok', top: 'empty', needsConstruct: false, documents: 0 };
  let anchors = new Map<string, number>();
  const open = new Set<string>();
  const stack: Array<{ size: number; anchor?: string }> = [];
  let aliases = 0;
  let docSize = 0;
  const add = (n: number): boolean => {
    const frame = stack[stack.length - 1];
    if (frame) frame.size += n + 2 * stack.length;
    else docSize += n;
    return (frame ? frame.size : docSize) <= limit && docSize <= limit;
  };
  const anchorOf = (e: { anchorStart: number; anchorEnd: number }) =>
    e.anchorStart === NO_RANGE ? undefined : source.slice(e.anchorStart, e.anchorEnd);
  for (const e of events) {
    switch (e.type) {
      case EVENT_ID.DOCUMENT:
        out.documents++;
        anchors = new Map();
        open.clear();
        stack.length = 0;
        aliases = 0;
        docSize = 0;
        break;
      case EVENT_ID.SCALAR: {
        if (out.documents === 1 && stack.length === 0)
          out.top = e.valueStart === NO_RANGE && e.tagStart === NO_RANGE ? 'empty' : 'scalar';
        if (e.tagStart !== NO_RANGE) out.needsConstruct = true;
        const size = (e.valueStart === NO_RANGE ? 0 : e.valueEnd - e.valueStart) + 2;
        const a = anchorOf(e);
        if (a !== undefined) anchors.set(a, size);
        if (!add(size)) return { ...out, verdict: 'over' };
        break;
      }
      case EVENT_ID.SEQUENCE:
      case EVENT_ID.MAPPING: {
        if (out.documents === 1 && stack.length === 0) out.top = e.type === EVENT_ID.MAPPING ? 'mapping' : 'sequence';
        if (e.tagStart !== NO_RANGE) out.needsConstruct = true;
        const a = anchorOf(e);
        if (a !== undefined) open.add(a);
        stack.push({ size: 2, ...(a !== undefined ? { anchor: a } : {}) });
        break;
      }
      case EVENT_ID.POP: {
        const f = stack.pop();
        if (!f) break;
        if (f.anchor !== undefined) {
          open.delete(f.anchor);
          anchors.set(f.anchor, f.size);
        }
        if (!add(f.size)) return { ...out, verdict: 'over' };
        break;
      }
      case EVENT_ID.ALIAS: {
        if (++aliases > LIMITS.yamlAliases) return { ...out, verdict: 'aliases' };
        const name = source.slice(e.anchorStart, e.anchorEnd);
        if (open.has(name)) return { ...out, verdict: 'cycle' };
        const size = anchors.get(name);
        if (size === undefined) out.needsConstruct = true; // js-yaml reports the unknown alias
        if (!add(size ?? 0)) return { ...out, verdict: 'over' };
        break;
      }
    }
  }
  return out;
}

// About the size in bytes the value would have serialised (as JSON, or as
// block YAML with its indentation), or 'over' once it passes `limit`, or
// 'cycle' for a value that contains itself (a recursive alias `&a [*a]`).
export function measureExpanded(value: unknown, limit: number): number | 'over' | 'cycle' {
  let total = 0;
  const path = new Set<object>();
  const visit = (v: unknown): boolean => {
    const indent = 2 * path.size;
    if (typeof v === 'string') total += v.length + 2;
    else if (v === null || typeof v !== 'object') total += 8;
    else if (v instanceof Uint8Array) total += v.length;
    else if (v instanceof Date) total += 26;
    else {
      if (path.has(v)) return false;
      path.add(v);
      total += 2;
      if (Array.isArray(v)) {
        for (const x of v) {
          total += 3 + indent;
          if (total > limit || !visit(x)) return false;
        }
      } else {
        const o = v as Record<string, unknown>;
        for (const k of Object.keys(o)) {
          total += k.length + 4 + indent;
          if (total > limit || !visit(o[k])) return false;
        }
      }
      path.delete(v);
    }
    return total <= limit;
  };
  const ok = visit(value);
  if (ok) return total;
  return total > limit ? 'over' : 'cycle';
}
