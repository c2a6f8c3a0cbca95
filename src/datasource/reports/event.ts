// One progress event as cloud-init's webhook reporting handler posts it
// (cloudinit/reporting/handlers.py WebHookHandler.publish_event: the JSON of
// events.py ReportingEvent.as_dict(), one event per POST):
//   {"name": "modules-final/config-scripts-user", "description": "...",
//    "event_type": "start" | "finish", "origin": "cloudinit",
//    "timestamp": 1700000000.123, "result": "SUCCESS" | "WARN" | "FAIL",
//    "files": [...]}
// `result` only on finish events, `files` only when a caller asked for
// post_files (their content, base64: never kept). The same in 22.4 and 25.1.
//
// Only the name, type, result, timestamp and a bounded, redacted description
// are kept. cloud-init's own descriptions are fixed templates ("running
// config-runcmd with frequency once-per-instance", "config-runcmd ran
// successfully and took 0.001 seconds"); a failing module's finish carries
// the same description, not the exception. But the sender is the guest, so
// anything may arrive: the description is cut, stripped of control
// characters, and anything shaped like a credential is replaced.

export type ReportedResult = 'SUCCESS' | 'WARN' | 'FAIL';

export interface ReportedEvent {
  // Full name, `<stage>` or `<stage>/<step>[/...]`.
  name: string;
  type: 'start' | 'finish';
  result?: ReportedResult;
  // cloud-init's time.time() in the guest, seconds.
  timestamp: number;
  description: string;
}

export const MAX_NAME_LENGTH = 128;
export const MAX_DESCRIPTION_LENGTH = 200;
const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9_.:/-]*$/;
const RESULTS = new Set<string>(['SUCCESS', 'WARN', 'FAIL']);

export type ParseResult = { ok: true; event: ReportedEvent } | { ok: false; reason: 'invalid-json' | 'invalid-event' };

export function parseReportedEvent(body: string): ParseResult {
  let v: unknown;
  try {
    v = JSON.parse(body);
  } catch {
    return { ok: false, reason: 'invalid-json' };
  }
  const event = eventOf(v);
  return event ? { ok: true, event } : { ok: false, reason: 'invalid-event' };
}

function eventOf(v: unknown): ReportedEvent | undefined {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return undefined;
  const o = v as Record<string, unknown>;
  const { name, event_type: type, timestamp, description, result } = o;
  if (typeof name !== 'string' || name.length > MAX_NAME_LENGTH || !NAME_RE.test(name)) return undefined;
  if (type !== 'start' && type !== 'finish') return undefined;
  if (typeof timestamp !== 'number' || !Number.isFinite(timestamp) || timestamp < 0) return undefined;
  if (description !== undefined && description !== null && typeof description !== 'string') return undefined;
  if (type === 'finish' && (typeof result !== 'string' || !RESULTS.has(result))) return undefined;
  return {
    name,
    type,
    ...(type === 'finish' ? { result: result as ReportedResult } : {}),
    timestamp,
    description: redactDescription(typeof description === 'string' ? description : ''),
  };
}

// Credentials as they could appear in a line of text: URL user-info, `key=
// value` / `key: value` for secret-sounding keys, bearer tokens, and long
// runs of base64 or hex (keys, hashes, tokens, encoded blobs).
const SECRET_PATTERNS: RegExp[] = [
  /\b[a-z][a-z0-9+.-]*:\/\/[^\s/@]*@/gi,
  /\b(pass(word|wd)?|secret|token|key|auth\w*|credential\w*)\b\s*[:=]\s*\S+/gi,
  /\bbearer\s+\S+/gi,
  /[A-Za-z0-9+/_-]{32,}={0,2}/g,
];

export function redactDescription(text: string): string {
  let s = text.slice(0, MAX_DESCRIPTION_LENGTH * 4);
  // Control characters (newlines included) would let one event fake lines
  // in a log or an Event message.
  s = s.replace(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]+/gu, ' ');
  for (const re of SECRET_PATTERNS) s = s.replace(re, '[redacted]');
  s = s.replace(/\s+/g, ' ').trim();
  const chars = [...s];
  return chars.length > MAX_DESCRIPTION_LENGTH ? `${chars.slice(0, MAX_DESCRIPTION_LENGTH - 1).join('')}…` : s;
}
