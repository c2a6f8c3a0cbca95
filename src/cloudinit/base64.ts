// Strict standard base64 as Go's base64.StdEncoding reads it (what KubeVirt
// uses for userDataBase64 and what the API server uses for Secret data):
// padding required, CR/LF ignored, anything else outside the alphabet is an
// error. Buffer.from(s, 'base64') silently skips junk, so it is not enough.

export type Base64Result = { ok: true; bytes: Uint8Array } | { ok: false; position: number; reason: string };

export function decodeBase64Strict(text: string): Base64Result {
  let clean = '';
  const positions: number[] = [];
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '\r' || c === '\n') continue;
    clean += c;
    positions.push(i);
  }
  let padStart = -1;
  for (let i = 0; i < clean.length; i++) {
    const c = clean.charCodeAt(i);
    const inAlphabet =
      (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || (c >= 48 && c <= 57) || c === 43 || c === 47;
    if (clean[i] === '=') {
      if (padStart < 0) padStart = i;
      continue;
    }
    if (!inAlphabet || padStart >= 0) {
      return { ok: false, position: positions[i] + 1, reason: `unexpected character at position ${positions[i] + 1}` };
    }
  }
  if (padStart >= 0 && clean.length - padStart > 2) {
    return { ok: false, position: positions[padStart] + 1, reason: `too much padding at position ${positions[padStart] + 1}` };
  }
  if (clean.length % 4 !== 0) {
    return { ok: false, position: text.length, reason: 'length is not a multiple of 4 (truncated or missing "=" padding)' };
  }
  return { ok: true, bytes: new Uint8Array(Buffer.from(clean, 'base64')) };
}
