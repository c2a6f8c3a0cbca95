// The parts of a MIME multipart user-data message, as cloud-init's
// user_data.py walks them (email.message_from_string, then msg.walk()):
// each leaf part's Content-Type and its body decoded from base64 or
// quoted-printable. Bounded: at most MAX_PARTS leaves and MAX_NESTING levels,
// so a message of many empty parts costs its own length.
export const MAX_PARTS = 64;
const MAX_NESTING = 4;

/** One leaf part of a multipart message. */
export interface MimePart {
  // Lower-cased, without parameters: "text/cloud-config".
  type: string;
  // The part's filename parameter, if any, to name it in messages.
  filename?: string;
  body: Uint8Array;
}

/** The leaves in order; `more` counts leaves past MAX_PARTS; `error` when the message is not multipart. */
export interface MimeWalk {
  parts: MimePart[];
  more: number;
  error?: string;
}

interface Headers {
  [name: string]: string;
}

function splitHead(text: string): { headers: Headers; body: string } {
  const m = /\r?\n\r?\n/.exec(text);
  const head = m ? text.slice(0, m.index) : text;
  const body = m ? text.slice(m.index + m[0].length) : '';
  const headers: Headers = {};
  let last = '';
  for (const line of head.split(/\r?\n/)) {
    if (/^[ \t]/.test(line) && last) headers[last] += ' ' + line.trim();
    else {
      const i = line.indexOf(':');
      if (i <= 0) continue;
      last = line.slice(0, i).trim().toLowerCase();
      headers[last] = line.slice(i + 1).trim();
    }
  }
  return { headers, body };
}

function param(value: string, name: string): string | undefined {
  const re = new RegExp(`;\\s*${name}\\s*=\\s*(?:"([^"]*)"|([^;\\s]*))`, 'i');
  const m = re.exec(value);
  return m ? (m[1] ?? m[2]) : undefined;
}

function decode(body: string, encoding: string | undefined): Uint8Array {
  const enc = (encoding ?? '').toLowerCase();
  if (enc === 'base64') return new Uint8Array(Buffer.from(body.replace(/\s+/g, ''), 'base64'));
  if (enc === 'quoted-printable') {
    const s = body.replace(/=\r?\n/g, '');
    const bytes: number[] = [];
    for (let i = 0; i < s.length; i++) {
      if (s[i] === '=' && /^[0-9A-Fa-f]{2}$/.test(s.slice(i + 1, i + 3))) {
        bytes.push(parseInt(s.slice(i + 1, i + 3), 16));
        i += 2;
      } else bytes.push(...Buffer.from(s[i], 'utf8'));
    }
    return new Uint8Array(bytes);
  }
  return new Uint8Array(Buffer.from(body, 'utf8'));
}

/** Walks a multipart user-data message (its text, decoded as latin1 or utf-8). */
export function walkMime(text: string): MimeWalk {
  const out: MimeWalk = { parts: [], more: 0 };
  const visit = (t: string, depth: number): void => {
    const { headers, body } = splitHead(t);
    const ctype = headers['content-type'] ?? 'text/plain';
    const type = ctype.split(';')[0].trim().toLowerCase();
    if (type.startsWith('multipart/')) {
      const boundary = param(ctype, 'boundary');
      if (!boundary || depth >= MAX_NESTING) {
        out.error ??= !boundary ? 'a multipart part has no boundary' : `multipart nested deeper than ${MAX_NESTING}`;
        return;
      }
      const delim = `--${boundary}`;
      const pieces = body.split(new RegExp(`(?:^|\\r?\\n)${delim.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
      // pieces[0] is the preamble; a piece starting "--" is the epilogue.
      for (const piece of pieces.slice(1)) {
        if (piece.startsWith('--')) break;
        visit(piece.replace(/^[ \t]*\r?\n/, ''), depth + 1);
      }
      return;
    }
    if (out.parts.length >= MAX_PARTS) {
      out.more++;
      return;
    }
    const filename = param(headers['content-disposition'] ?? '', 'filename') ?? param(ctype, 'name');
    out.parts.push({
      type,
      ...(filename ? { filename } : {}),
      body: decode(body, headers['content-transfer-encoding']),
    });
  };
  const { headers } = splitHead(text);
  if (!(headers['content-type'] ?? '').toLowerCase().startsWith('multipart/'))
    return { parts: [], more: 0, error: 'the message has no multipart Content-Type' };
  visit(text, 0);
  return out;
}
