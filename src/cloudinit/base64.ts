// Strict standard base64 as Go's base64.StdEncoding reads it (what KubeVirt
// uses for userDataBase64 and what the API server uses for Secret data):
// padding required, CR/LF ignored, anything else outside the alphabet is an
// error. Buffer.from(s, 'base64') silently skips junk, so it is not enough
// alone: one regular expression checks the text (linear, no backtracking),
// then Buffer decodes it natively. Only a failed check walks the text again,
// to say where it went wrong.

export type Base64Result = { ok: true; bytes: Uint8Array } | { ok: false; position: number; reason: string };

// The body without its padding; CR and LF are removed first.
const STRICT = /^[A-Za-z0-9+/]*$/;
const LINE_BREAKS = /[\r\n]/g;

/**
 * Decodes base64 as Go's StdEncoding reads it (header). Never throws: a refusal gives the 1-based
 * position where the text stops being strict base64 and a reason for the message.
 */
export function decodeBase64Strict(text: string): Base64Result {
  const clean = /[\r\n]/.test(text) ? text.replace(LINE_BREAKS, '') : text;
  const pad = clean.endsWith('==') ? 2 : clean.endsWith('=') ? 1 : 0;
  const body = pad === 0 ? clean : clean.slice(0, -pad);
  if (clean.length % 4 === 0 && STRICT.test(body)) {
    return { ok: true, bytes: new Uint8Array(Buffer.from(clean, 'base64')) };
  }
  return explain(text);
}

// Where the text stops being strict base64, for the error message.
function explain(text: string): Base64Result & { ok: false } {
  let n = 0;
  let padStart = -1;
  let padPos = -1;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 13 || c === 10) continue;
    if (c === 61) {
      if (padStart < 0) {
        padStart = n;
        padPos = i;
      }
      n++;
      continue;
    }
    const inAlphabet = (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || (c >= 48 && c <= 57) || c === 43 || c === 47;
    if (!inAlphabet || padStart >= 0)
      return { ok: false, position: i + 1, reason: `unexpected character at position ${i + 1}` };
    n++;
  }
  if (padStart >= 0 && n - padStart > 2)
    return { ok: false, position: padPos + 1, reason: `too much padding at position ${padPos + 1}` };
  return {
    ok: false,
    position: text.length,
    reason: 'length is not a multiple of 4 (truncated or missing "=" padding)',
  };
}
