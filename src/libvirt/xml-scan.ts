// The one reader of the XML libvirt prints (virDomainGetXMLDesc), for the
// injector's disks (disk-xml.ts) and the devices metadata's interfaces and
// host devices (domain-devices.ts): elements, attributes, text, comments,
// CDATA, processing instructions and the five predefined entities plus
// character references. No DTD (libvirt never prints one; refusing it rules
// out entity expansion), no namespaces beyond keeping a prefix as part of
// the name.
//
// Why not a general parser: the injector reads a domain's XML on every
// injection, and a callback walk that keeps only what the caller asks for
// builds no object tree: against a whole fast-xml-parser tree it reads a
// domain's devices several times faster, and a hostile 1 MiB document in a
// fraction of the time and heap (measured: docs/libvirt-rpc.md, "Tests and
// figures"; `npm run bench:inject` re-runs the launcher-XML comparison).
import { VmseedError } from '../errors.ts';

export interface XmlVisitor {
  // `depth`: 0 for the root element.
  open?(name: string, depth: number, attrs: Record<string, string>, selfClosing: boolean): void;
  close?(name: string, depth: number): void;
  text?(text: string, depth: number): void;
}

const NAME = /[^\s=/>"'<]+/y;
const WS = /\s*/y;

function fail(what: string, at: number): never {
  throw new VmseedError(
    'DOMAIN_XML_REFUSED',
    `libvirt returned domain XML that is not well-formed (${what} at offset ${at}); check the libvirt version`,
    { kind: 'retryable' },
  );
}

const ENTITIES: Record<string, string> = { lt: '<', gt: '>', amp: '&', quot: '"', apos: "'" };

function decode(s: string, at: number): string {
  if (!s.includes('&')) return s;
  return s.replace(/&([^;&\s]*);?/g, (m, body: string) => {
    if (!m.endsWith(';')) fail('an unterminated entity reference', at);
    if (body in ENTITIES) return ENTITIES[body];
    const code = /^#x[0-9a-fA-F]{1,6}$/.test(body)
      ? parseInt(body.slice(2), 16)
      : /^#[0-9]{1,7}$/.test(body)
        ? parseInt(body.slice(1), 10)
        : NaN;
    if (!Number.isInteger(code) || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))
      fail(`an unknown entity '&${body};'`, at);
    return String.fromCodePoint(code);
  });
}

function readAttrs(xml: string, from: number, to: number): Record<string, string> {
  const attrs: Record<string, string> = Object.create(null) as Record<string, string>;
  let i = from;
  for (;;) {
    WS.lastIndex = i;
    WS.exec(xml);
    i = WS.lastIndex;
    if (i >= to) return attrs;
    NAME.lastIndex = i;
    const m = NAME.exec(xml);
    if (!m) fail('a malformed attribute', i);
    i = NAME.lastIndex;
    WS.lastIndex = i;
    WS.exec(xml);
    i = WS.lastIndex;
    if (xml[i] !== '=') fail('an attribute without a value', i);
    WS.lastIndex = i + 1;
    WS.exec(xml);
    i = WS.lastIndex;
    const q = xml[i];
    if (q !== '"' && q !== "'") fail('an unquoted attribute value', i);
    const end = xml.indexOf(q, i + 1);
    if (end < 0 || end >= to) fail('an unterminated attribute value', i);
    const raw = xml.slice(i + 1, end);
    if (raw.includes('<')) fail("a '<' in an attribute value", i);
    if (m[0] in attrs) fail(`a repeated attribute '${m[0]}'`, i);
    attrs[m[0]] = decode(raw, i);
    i = end + 1;
  }
}

// Where the start tag that begins at `from` (just after its name) ends:
// the index of its '>', skipping quoted attribute values (which may hold '>').
function tagEnd(xml: string, from: number): number {
  let quote = 0;
  for (let i = from; i < xml.length; i++) {
    const c = xml.charCodeAt(i);
    if (quote !== 0) {
      if (c === quote) quote = 0;
    } else if (c === 0x3e /* > */) {
      return i;
    } else if (c === 0x22 /* " */ || c === 0x27 /* ' */) {
      quote = c;
    }
  }
  return fail(quote !== 0 ? 'an unterminated attribute value' : 'an unterminated tag', from);
}

// Walks the document once, calling the visitor; throws DOMAIN_XML_REFUSED on
// anything that is not well-formed (mismatched tags, text outside the root,
// a DOCTYPE, an unknown entity, a repeated attribute).
export function walkXml(xml: string, v: XmlVisitor): void {
  const stack: string[] = [];
  let rootSeen = false;
  let i = 0;
  const n = xml.length;
  while (i < n) {
    const lt = xml.indexOf('<', i);
    const textEnd = lt < 0 ? n : lt;
    if (textEnd > i) {
      const raw = xml.slice(i, textEnd);
      if (stack.length === 0) {
        if (raw.trim() !== '') fail('text outside the root element', i);
      } else {
        const text = decode(raw, i);
        v.text?.(text, stack.length);
      }
    }
    if (lt < 0) break;
    if (xml.startsWith('<!--', lt)) {
      const end = xml.indexOf('-->', lt + 4);
      if (end < 0) fail('an unterminated comment', lt);
      i = end + 3;
    } else if (xml.startsWith('<![CDATA[', lt)) {
      if (stack.length === 0) fail('CDATA outside the root element', lt);
      const end = xml.indexOf(']]>', lt + 9);
      if (end < 0) fail('an unterminated CDATA section', lt);
      v.text?.(xml.slice(lt + 9, end), stack.length);
      i = end + 3;
    } else if (xml.startsWith('<?', lt)) {
      const end = xml.indexOf('?>', lt + 2);
      if (end < 0) fail('an unterminated processing instruction', lt);
      i = end + 2;
    } else if (xml.startsWith('<!', lt)) {
      fail('a DOCTYPE or other declaration', lt);
    } else if (xml[lt + 1] === '/') {
      NAME.lastIndex = lt + 2;
      const m = NAME.exec(xml);
      if (!m) fail('a malformed end tag', lt);
      const gt = xml.indexOf('>', NAME.lastIndex);
      if (gt < 0 || xml.slice(NAME.lastIndex, gt).trim() !== '') fail('a malformed end tag', lt);
      if (stack.pop() !== m[0]) fail(`an end tag '${m[0]}' that closes nothing open`, lt);
      v.close?.(m[0], stack.length);
      i = gt + 1;
    } else {
      NAME.lastIndex = lt + 1;
      const m = NAME.exec(xml);
      if (!m) fail('a malformed start tag', lt);
      if (stack.length === 0 && rootSeen) fail('a second root element', lt);
      const afterName = NAME.lastIndex;
      const gt = tagEnd(xml, afterName);
      const selfClosing = xml[gt - 1] === '/' && gt - 1 >= afterName;
      const attrEnd = selfClosing ? gt - 1 : gt;
      if (attrEnd > afterName && !/\s/.test(xml[afterName])) fail('a malformed start tag', lt);
      const attrs = readAttrs(xml, afterName, attrEnd);
      const depth = stack.length;
      rootSeen = true;
      v.open?.(m[0], depth, attrs, selfClosing);
      if (selfClosing) v.close?.(m[0], depth);
      else stack.push(m[0]);
      i = gt + 1;
    }
  }
  if (stack.length > 0) fail(`an unclosed element '${stack[stack.length - 1]}'`, n);
  if (!rootSeen) fail('no root element', 0);
}
