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

/** The `result` of a finish event. */
export type ReportedResult = 'SUCCESS' | 'WARN' | 'FAIL';

/**
 * A progress event as kept: the guest's fields, checked, with the description
 * cut and redacted (parseReportedEvent).
 */
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

// Credentials as they could appear in a line of text: URL user-info, bearer
// tokens, `key=value` / `key: value` for secret-sounding keys, and long runs
// of base64 or hex (keys, hashes, tokens, encoded blobs). Bearer goes before
// key=value: in `Authorization: Bearer x` the latter would take `Bearer` for
// the value and leave the token.
const REDACTED = '[redacted]';
const USER_INFO = /\b[a-z][a-z0-9+.-]*:\/\/[^\s/@]*@/gi;
const BEARER = /\bbearer\s+\S+/gi;
const LONG_RUN = /[A-Za-z0-9+/_-]{32,}={0,2}/g;

// A key is secret-sounding when any part of its name is: snake_case and
// camelCase names too (DB_PASSWORD, client_secret, accessToken).
const SECRET_PART = /^(?:pass(?:word|wd|phrase)?|secret|token|key|auth[a-z]*|credential[a-z]*)$/i;
const SECRET_WORD = /pass|secret|token|key|auth|credential/i;
const NAME_PARTS = /_+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])/;
const KEY_SEP = /(?<![A-Za-z0-9_])([A-Za-z0-9_]+)\s*[:=]\s*/g;
const NOT_SPACE_RUN = /\S+/y;

// One scan, names first: a pattern that searched for the secret word inside
// a name (`\w*?key\w*`) backtracks quadratically on a long word, and the
// guest chooses the text. The value of any other key is scanned in turn, so
// `user: password=x` loses x.
function redactKeyValues(s: string): string {
  let out = '';
  let kept = 0;
  KEY_SEP.lastIndex = 0;
  for (let m = KEY_SEP.exec(s); m !== null; m = KEY_SEP.exec(s)) {
    if (!SECRET_WORD.test(m[1]) || !m[1].split(NAME_PARTS).some((part) => SECRET_PART.test(part))) continue;
    NOT_SPACE_RUN.lastIndex = KEY_SEP.lastIndex;
    if (!NOT_SPACE_RUN.test(s)) continue;
    out += s.slice(kept, m.index) + REDACTED;
    kept = KEY_SEP.lastIndex = NOT_SPACE_RUN.lastIndex;
  }
  return out + s.slice(kept);
}

export function redactDescription(text: string): string {
  let s = text.slice(0, MAX_DESCRIPTION_LENGTH * 4);
  // Control characters (newlines included) would let one event fake lines
  // in a log or an Event message.
  s = s.replace(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]+/gu, ' ');
  s = redactKeyValues(s.replace(USER_INFO, REDACTED).replace(BEARER, REDACTED)).replace(LONG_RUN, REDACTED);
  s = s.replace(/\s+/g, ' ').trim();
  const chars = [...s];
  return chars.length > MAX_DESCRIPTION_LENGTH ? `${chars.slice(0, MAX_DESCRIPTION_LENGTH - 1).join('')}…` : s;
}
