// The forms a secret takes on its way out: a leak rarely prints the value as
// it was planted. user-data arrives base64 (userDataBase64, Secret data), a
// log serializer JSON-escapes (some escape `/` as `\/`, or `/`, `+`, `=`,
// `<`, `>`, `&`, `'` as `\u00xx`), a URL percent-encodes (upper or lower
// case hex, or form-encodes), a page HTML-escapes. The encodings compound: a
// base64 key (its `+`, `/`, `=`) logged in JSON or put in a query string.
// A search for a secret searches for all of them.

export interface SecretForm {
  form: string;
  text: string;
}

// The base64 characters that hold only `value`'s bits when it sits at byte
// offset `shift` (mod 3) of a longer encoded text: what any base64 of a text
// containing `value` contains, whatever comes before and after it.
function base64Inner(value: Buffer, shift: number): string {
  const encoded = Buffer.concat([Buffer.alloc(shift), value, Buffer.alloc(2)]).toString('base64');
  const firstBit = shift * 8;
  const endBit = (shift + value.length) * 8;
  const from = Math.ceil(firstBit / 6);
  const to = Math.floor(endBit / 6);
  return encoded.slice(from, to);
}

const url = (b64: string) => b64.replace(/\+/g, '-').replace(/\//g, '_');

// What JSON encoders other than JSON.stringify escape as \u00xx, each alone
// and all at once: `/` and `+` (Jackson and .NET options, some loggers),
// `<`, `>`, `&` (Go's encoding/json), those and `=`, `'` (Gson).
const UNICODE_ESCAPED = [/[/]/g, /[+]/g, /[/+]/g, /[<>&]/g, /[<>&=']/g, /[/+=<>&']/g];
const unicodeEscape = (c: string, upper: boolean) => {
  const hex = c.charCodeAt(0).toString(16).padStart(4, '0');
  return `\\u${upper ? hex.toUpperCase() : hex}`;
};

// The JSON-escaped forms of `text`, without the quotes.
function jsonForms(text: string): Array<[string, string]> {
  const j = JSON.stringify(text).slice(1, -1);
  const forms: Array<[string, string]> = [
    ['JSON-escaped', j],
    ['JSON-escaped, / as \\/', j.replaceAll('/', '\\/')],
  ];
  for (const set of UNICODE_ESCAPED)
    for (const upper of [false, true])
      forms.push([
        `JSON-escaped, ${set.source.slice(1, -1)} as \\u00${upper ? 'XX' : 'xx'}`,
        j.replace(set, (c) => unicodeEscape(c, upper)),
      ]);
  return forms;
}

// The URL-encoded forms of `text`.
function urlForms(text: string): Array<[string, string]> {
  const u = encodeURIComponent(text);
  return [
    ['URL-encoded', u],
    ['URL-encoded, lower-case hex', u.replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase())],
    ['form-encoded', new URLSearchParams({ x: text }).toString().slice(2)],
  ];
}

const HTML: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

export function secretForms(value: string | Buffer): SecretForm[] {
  const bytes = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
  const text = bytes.toString('utf8');
  // The forms an encoder makes of the value itself; each is then also
  // searched JSON-escaped and URL-encoded.
  const bases: SecretForm[] = [{ form: 'plain', text }];
  for (const shift of [0, 1, 2]) {
    const inner = base64Inner(bytes, shift);
    bases.push(
      { form: `base64 (offset ${shift})`, text: inner },
      { form: `base64url (offset ${shift})`, text: url(inner) },
    );
  }
  const forms: SecretForm[] = [...bases];
  for (const b of bases) {
    const prefix = b.form === 'plain' ? '' : `${b.form}, `;
    for (const [form, t] of [...jsonForms(b.text), ...urlForms(b.text)])
      forms.push({ form: `${prefix}${form}`, text: t });
  }
  forms.push(
    { form: 'HTML-escaped', text: text.replace(/[&<>"']/g, (c) => HTML[c]) },
    { form: 'hex', text: bytes.toString('hex') },
  );
  const seen = new Set<string>();
  return forms.filter((f) => f.text.length > 0 && !seen.has(f.text) && seen.add(f.text));
}

// Where in `haystack` some form of a secret appears, or undefined.
export function findSecret(haystack: string, forms: SecretForm[]): { form: string; at: number } | undefined {
  for (const f of forms) {
    const at = haystack.indexOf(f.text);
    if (at !== -1) return { form: f.form, at };
  }
  return undefined;
}
