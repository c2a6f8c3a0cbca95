// The forms a secret takes on its way out: a leak rarely prints the value as
// it was planted. user-data arrives base64 (userDataBase64, Secret data), a
// log serializer JSON-escapes, a URL percent-encodes. A search for a secret
// searches for all of them.

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

export function secretForms(value: string | Buffer): SecretForm[] {
  const bytes = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
  const text = bytes.toString('utf8');
  const forms: SecretForm[] = [{ form: 'plain', text }];
  for (const shift of [0, 1, 2]) {
    const inner = base64Inner(bytes, shift);
    forms.push(
      { form: `base64 (offset ${shift})`, text: inner },
      { form: `base64url (offset ${shift})`, text: url(inner) },
    );
  }
  forms.push(
    { form: 'JSON-escaped', text: JSON.stringify(text).slice(1, -1) },
    { form: 'URL-encoded', text: encodeURIComponent(text) },
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
