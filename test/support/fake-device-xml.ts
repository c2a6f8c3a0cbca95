// The fake libvirt's own reader of the device XML it is given, written from
// the XML 1.0 specification (well-formedness, attribute-value
// normalisation) and libvirt's disk schema (docs/formatdomain.rst "Hard
// drives, floppy disks, CDROMs", src/conf/schemas/domaincommon.rng), not
// from vmseed's parser: XML vmseed's own reader forgives but libvirt's
// libxml2 refuses or reads differently fails here too.

export interface XmlElement {
  name: string;
  attrs: Map<string, string>;
  children: XmlElement[];
  text: string;
}

export class XmlRefused extends Error {}

// XML 1.0 production [5] Name, ASCII part (libvirt's vocabulary is ASCII).
const NAME = /[A-Za-z_:][-A-Za-z0-9._:]*/y;
const SPACE = /[ \t\r\n]+/y;
const PREDEFINED: Record<string, string> = { lt: '<', gt: '>', amp: '&', quot: '"', apos: "'" };

function refuse(what: string, at: number): never {
  throw new XmlRefused(`${what} at offset ${at}`);
}

// Character and predefined entity references ([66], [68]); a bare '&' is
// not well-formed.
function expand(raw: string, at: number): string {
  return raw.replace(/&([^;]*);|&/g, (m, body: string | undefined) => {
    if (body === undefined) refuse("a bare '&'", at);
    if (Object.hasOwn(PREDEFINED, body)) return PREDEFINED[body];
    const hex = /^#x([0-9A-Fa-f]+)$/.exec(body);
    const dec = /^#([0-9]+)$/.exec(body);
    const code = hex ? parseInt(hex[1], 16) : dec ? parseInt(dec[1], 10) : NaN;
    if (!(code === 0x9 || code === 0xa || code === 0xd || (code >= 0x20 && code <= 0x10ffff)))
      refuse(`the reference '${m}'`, at);
    return String.fromCodePoint(code);
  });
}

class Reader {
  readonly #s: string;
  #at = 0;

  constructor(s: string) {
    this.#s = s;
  }

  #match(re: RegExp): string | undefined {
    re.lastIndex = this.#at;
    const m = re.exec(this.#s);
    if (!m) return undefined;
    this.#at = re.lastIndex;
    return m[0];
  }

  #name(): string {
    return this.#match(NAME) ?? refuse('a name expected', this.#at);
  }

  #expect(lit: string): void {
    if (!this.#s.startsWith(lit, this.#at)) refuse(`'${lit}' expected`, this.#at);
    this.#at += lit.length;
  }

  // Comments, processing instructions and white space between markup.
  #misc(): void {
    for (;;) {
      this.#match(SPACE);
      if (this.#s.startsWith('<!--', this.#at)) this.#comment();
      else if (this.#s.startsWith('<?', this.#at)) this.#pi();
      else return;
    }
  }

  #comment(): void {
    const end = this.#s.indexOf('-->', this.#at + 4);
    if (end < 0) refuse('an unterminated comment', this.#at);
    if (this.#s.slice(this.#at + 4, end).includes('--')) refuse("'--' inside a comment", this.#at);
    this.#at = end + 3;
  }

  #pi(): void {
    const end = this.#s.indexOf('?>', this.#at);
    if (end < 0) refuse('an unterminated processing instruction', this.#at);
    this.#at = end + 2;
  }

  document(): XmlElement {
    if (this.#s.startsWith('\ufeff')) this.#at = 1;
    this.#misc();
    if (this.#s.startsWith('<!DOCTYPE', this.#at)) refuse('a DOCTYPE (not expected from vmseed)', this.#at);
    const root = this.#element();
    this.#misc();
    if (this.#at !== this.#s.length) refuse('content after the root element', this.#at);
    return root;
  }

  // [39] element: a start tag whose attributes are each preceded by white
  // space ([40]), an empty-element tag or content and a matching end tag.
  #element(): XmlElement {
    this.#expect('<');
    const el: XmlElement = { name: this.#name(), attrs: new Map(), children: [], text: '' };
    for (;;) {
      const space = this.#match(SPACE) !== undefined;
      if (this.#s.startsWith('/>', this.#at)) {
        this.#at += 2;
        return el;
      }
      if (this.#s[this.#at] === '>') {
        this.#at++;
        break;
      }
      if (!space) refuse('white space expected before an attribute', this.#at);
      this.#attribute(el);
    }
    this.#content(el);
    this.#expect('</');
    if (this.#name() !== el.name) refuse(`an end tag that does not close <${el.name}>`, this.#at);
    this.#match(SPACE);
    this.#expect('>');
    return el;
  }

  // [41] Attribute; §3.3.3: each literal tab, newline or carriage return
  // in the value becomes a space (references to them do not).
  #attribute(el: XmlElement): void {
    const at = this.#at;
    const name = this.#name();
    this.#match(SPACE);
    this.#expect('=');
    this.#match(SPACE);
    const q = this.#s[this.#at];
    if (q !== '"' && q !== "'") refuse('a quoted attribute value expected', this.#at);
    const end = this.#s.indexOf(q, this.#at + 1);
    if (end < 0) refuse('an unterminated attribute value', this.#at);
    const raw = this.#s.slice(this.#at + 1, end);
    if (raw.includes('<')) refuse("'<' in an attribute value", this.#at);
    if (el.attrs.has(name)) refuse(`the attribute '${name}' twice`, at);
    el.attrs.set(name, expand(raw.replace(/[\t\n\r]/g, ' '), this.#at));
    this.#at = end + 1;
  }

  #content(el: XmlElement): void {
    for (;;) {
      const lt = this.#s.indexOf('<', this.#at);
      if (lt < 0) refuse(`<${el.name}> is not closed`, this.#at);
      const raw = this.#s.slice(this.#at, lt);
      if (raw.includes(']]>')) refuse("']]>' in text", this.#at);
      el.text += expand(raw, this.#at);
      this.#at = lt;
      if (this.#s.startsWith('</', lt)) return;
      if (this.#s.startsWith('<!--', lt)) this.#comment();
      else if (this.#s.startsWith('<![CDATA[', lt)) {
        const end = this.#s.indexOf(']]>', lt);
        if (end < 0) refuse('an unterminated CDATA section', lt);
        el.text += this.#s.slice(lt + 9, end);
        this.#at = end + 3;
      } else if (this.#s.startsWith('<?', lt)) this.#pi();
      else el.children.push(this.#element());
    }
  }
}

// §2.11: a parser reads every literal CR LF pair and lone CR as LF.
export function parseXml(xml: string): XmlElement {
  return new Reader(xml.replace(/\r\n?/g, '\n')).document();
}

// A disk as the fake keeps it.
export interface FakeDisk {
  type: string;
  device: string;
  bus: string;
  targetDev: string;
  sourceFile: string | undefined;
  alias: string | undefined;
  serial: string | undefined;
  readonly: boolean;
}

// The source attribute by disk type (domaincommon.rng diskSourceFile,
// diskSourceBlock, diskSourceDir): a file disk's path is `file`, never `dev`.
const SOURCE_ATTR: Record<string, string> = { file: 'file', block: 'dev', dir: 'dir' };

function only(el: XmlElement, name: string): XmlElement | undefined {
  const found = el.children.filter((c) => c.name === name);
  if (found.length > 1) throw new XmlRefused(`<disk> has ${found.length} <${name}> elements`);
  return found[0];
}

// One <disk> device as attach-device/detach-device take it. type and device
// default to file and disk, as libvirt's parser does; libvirt 9.0 refuses a
// disk with no target dev, and a hard disk with no source path of its
// type's attribute, with the messages used here.
export function parseDiskDevice(xml: string): FakeDisk {
  let disk: XmlElement;
  try {
    disk = parseXml(xml);
  } catch (e) {
    if (e instanceof XmlRefused) throw new XmlRefused(`(device_definition): ${e.message}`);
    throw e;
  }
  if (disk.name !== 'disk') throw new XmlRefused(`a <disk> device expected, not <${disk.name}>`);
  const type = disk.attrs.get('type') ?? 'file';
  const device = disk.attrs.get('device') ?? 'disk';
  const sourceAttr = SOURCE_ATTR[type];
  if (sourceAttr === undefined) throw new XmlRefused(`disk type '${type}' is not one the fake knows`);
  const target = only(disk, 'target');
  const targetDev = target?.attrs.get('dev');
  const sourceFile = only(disk, 'source')?.attrs.get(sourceAttr);
  if (targetDev === undefined) throw new XmlRefused(`missing target information for device ${sourceFile}`);
  if (sourceFile === undefined && device === 'disk')
    throw new XmlRefused(`missing source information for device ${targetDev}`);
  const serial = only(disk, 'serial');
  return {
    type,
    device,
    bus: target?.attrs.get('bus') ?? '',
    targetDev,
    sourceFile,
    alias: only(disk, 'alias')?.attrs.get('name'),
    serial: serial?.text,
    readonly: only(disk, 'readonly') !== undefined,
  };
}
