// In-process ISO 9660 writer: PVD + Joliet SVD (level 3) + Rock Ridge, the
// combination every seed consumer reads (Linux isofs, blkid, bsdtar, Windows
// CDFS, cloudbase-init). Pure: the timestamp comes in, no clock, no I/O.
// Facts and offsets: ECMA-119 2nd ed. (1987) clauses 6-9 (volume descriptors
// 8.3-8.5, directory records 9.1, path tables 9.4, numbers 7.1-7.3); the
// Joliet specification (Microsoft, 1995: SVD escape sequences, UCS-2 BE
// names); SUSP and RRIP (IEEE P1281/P1282, RRIP 1.12: SP, ER, CE, PX, TF,
// NM). Which extension each reader needs: Linux fs/isofs/inode.c
// isofs_fill_super and rock.c, util-linux libblkid/src/superblocks/iso9660.c.
//
// Layout (2048-byte sectors):
//   0-15 system area (zero) | 16 PVD | 17 Joliet SVD | 18 terminator
//   19.. path tables: primary L, primary M, Joliet L, Joliet M
//   primary directories, each followed by its continuation area when a
//   Rock Ridge name is too long for its record | Joliet directories
//   file data | zero padding to 4 KiB
// Size floor (why 16 KiB of input cannot fit in 64 KiB = 32 sectors):
//   16 system area + 3 volume descriptors (PVD, Joliet SVD, terminator)
//   + 4 path tables (L and M for each tree; each table starts on its own
//   logical block, ECMA-119 6.9.2/8.4.14-17, and both types are mandatory)
//   + 2 root directories (primary with Rock Ridge, Joliet with UCS-2 names)
//   = 25 sectors = 50 KiB before the first file. Each file extent starts on
//   its own block, so user-data U and meta-data M take ceil(U/2048) +
//   ceil(M/2048) sectors: 16 KiB of total input takes 8 (both sizes
//   multiples of 2048) or 9, i.e. 33 or 34 sectors, and the 4 KiB rounding
//   QEMU needs makes both 34 sectors = 68 KiB. 64 KiB leaves 7 data sectors:
//   12 KiB of user-data with up to 2 KiB of meta-data. The ER rides in the
//   root `.` record (see ER_SRC), so no continuation sector is added unless
//   a name needs one. Going lower needs 512-byte logical blocks (allowed by
//   ECMA-119 6.1.2, but rare, untested with Windows CDFS, cloudbase-init or
//   libarchive) or dropping Joliet (Windows) or Rock Ridge (Linux names).
// Minimum size (MIN_SECTORS): images are never smaller than
//   0x11000 bytes (68 KiB). busybox's volume_id (findfs, blkid, mount
//   LABEL= in busybox-based guests such as CirrOS, and old udev vol_id)
//   reads a fixed SB_BUFFER_SIZE of 0x11000 bytes before probing iso9660
//   and gives up on a shorter device, so a 60 KiB seed is invisible there
//   (seen in e2e/kernel-reads-iso.test.ts). The padding is zeros.
// Continuation areas sit right after their directory as in genisoimage:
// libarchive reads sequentially and only reads a CE area at the position
// where it stops after the directory (anywhere else the name is lost).
import { VmseedError } from '../errors.ts';

export interface IsoFile {
  // Slash-separated, relative: `user-data`, `openstack/latest/meta_data.json`.
  path: string;
  data: Uint8Array;
  // Permission bits for Rock Ridge (default 0o444: a seed is read-only media).
  mode?: number;
}

export interface IsoInput {
  label: string;
  files: IsoFile[];
  timestamp: Date;
}

const SECTOR = 2048;
// buildIso never writes below sector 16: every image starts with these many
// zero bytes (seed-image.ts hashes them once, not per image).
export const SYSTEM_AREA_BYTES = 16 * SECTOR;
const FIRST_FREE_SECTOR = 19;
// cloudbase-init reads the low 16 bits of the volume size.
export const MAX_SECTORS = 65536;
// 0x11000 bytes: busybox volume_id's SB_BUFFER_SIZE (see the header).
export const MIN_SECTORS = 34;
export const MAX_JOLIET_NAME = 64;
export const MAX_LABEL = 32;
// A label that blkid reports verbatim and cloud-init can match: no spaces
// (blkid trims them), nothing a udev by-label link would escape.
const LABEL_RE = /^[A-Za-z0-9_.-]{1,32}$/;
// Joliet forbids these (plus anything outside UCS-2, i.e. surrogates).

const JOLIET_FORBIDDEN = /[\u0000-\u001f*/:;?\\\ud800-\udfff]/;

const S_IFDIR = 0o040000;
const S_IFREG = 0o100000;
const DEFAULT_FILE_MODE = 0o444;
const DIR_MODE = 0o555;

// ER: readers look only at the identifier. Linux isofs sets s_rock on any
// ER in the root `.` (rock.c, after rock_check_overflow's 4-byte minimum);
// libisofs (xorriso) and Plan 9/hamigaki/brasero readers match len_id 10 +
// "RRIP_1991A"; libarchive detects Rock Ridge by SP alone. So the standard
// descriptor is kept and the source text shortened (genisoimage's 135-byte
// one would not fit) to put the ER in the root `.` record itself: no CE,
// no continuation sector.
const ER_ID = 'RRIP_1991A';
const ER_DES = 'THE ROCK RIDGE INTERCHANGE PROTOCOL PROVIDES SUPPORT FOR POSIX FILE SYSTEM SEMANTICS';
const ER_SRC = 'IEEE P1282 ROCK RIDGE INTERCHANGE PROTOCOL';
const ER_LEN = 8 + ER_ID.length + ER_DES.length + ER_SRC.length;

const PX_LEN = 36; // RRIP 1.10 (RRIP_1991A): no inode number
const TF_LEN = 5 + 3 * 7; // modify, access, attributes
const CE_LEN = 28;
const SP_LEN = 7;
const NM_HEAD = 5;
const MAX_RECORD = 254; // records are even-length and at most 255 bytes

interface CeSlot {
  sector: number;
  offset: number;
}

interface FileNode {
  kind: 'file';
  name: string;
  data: Uint8Array;
  mode: number;
  pId: Uint8Array;
  jId: Uint8Array;
  nm: Uint8Array;
  nmInCe: CeSlot | null;
  lba: number;
}

interface DirNode {
  kind: 'dir';
  name: string;
  parent: DirNode | null;
  children: Map<string, Node>;
  pId: Uint8Array;
  jId: Uint8Array;
  nm: Uint8Array;
  nmInCe: CeSlot | null;
  pChildren: Node[];
  jChildren: Node[];
  subdirs: number;
  pLba: number;
  pSize: number;
  pNum: number;
  ceLba: number;
  ceSectors: number;
  jLba: number;
  jSize: number;
  jNum: number;
}

type Node = FileNode | DirNode;

const utf8 = new TextEncoder();
const EMPTY = new Uint8Array(0);
const DOT = Uint8Array.of(0);
const DOTDOT = Uint8Array.of(1);

function fail(
  code:
    | 'ISO_PATH_EMPTY'
    | 'ISO_PATH_DUPLICATE'
    | 'ISO_NAME_TOO_LONG'
    | 'ISO_NAME_INVALID'
    | 'ISO_LABEL_INVALID'
    | 'ISO_TOO_LARGE'
    | 'ISO_TIMESTAMP_INVALID',
  message: string,
  field: string,
): never {
  throw new VmseedError(code, message, { kind: 'terminal', field });
}

function newDir(name: string, parent: DirNode | null): DirNode {
  return {
    kind: 'dir',
    name,
    parent,
    children: new Map(),
    pId: EMPTY,
    jId: EMPTY,
    nm: EMPTY,
    nmInCe: null,
    pChildren: [],
    jChildren: [],
    subdirs: 0,
    pLba: 0,
    pSize: 0,
    pNum: 0,
    ceLba: 0,
    ceSectors: 0,
    jLba: 0,
    jSize: 0,
    jNum: 0,
  };
}

function ascii(s: string): Uint8Array {
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

function ucs2(s: string): Uint8Array {
  const out = new Uint8Array(s.length * 2);
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    out[2 * i] = c >> 8;
    out[2 * i + 1] = c & 0xff;
  }
  return out;
}

function validateName(name: string, field: string): void {
  if (name === '' || name === '.' || name === '..') {
    fail(
      'ISO_NAME_INVALID',
      `${field}: path has an empty, '.' or '..' component; use a plain relative path like 'openstack/latest/user_data'`,
      field,
    );
  }
  if (name.length > MAX_JOLIET_NAME) {
    fail(
      'ISO_NAME_TOO_LONG',
      `${field}: a path component is ${name.length} characters; Joliet allows at most ${MAX_JOLIET_NAME}`,
      field,
    );
  }
  if (JOLIET_FORBIDDEN.test(name)) {
    fail(
      'ISO_NAME_INVALID',
      `${field}: a path component contains a character Joliet forbids (control characters, * : ; ? \\ or characters outside UCS-2); rename it`,
      field,
    );
  }
}

function buildTree(files: IsoFile[]): DirNode {
  const root = newDir('', null);
  files.forEach((f, i) => {
    const field = `files[${i}].path`;
    if (typeof f.path !== 'string' || f.path === '')
      fail('ISO_PATH_EMPTY', `${field}: the path is empty; give every file a relative path`, field);
    const parts = f.path.split('/');
    parts.forEach((p) => validateName(p, field));
    let dir = root;
    for (let k = 0; k < parts.length - 1; k++) {
      const existing = dir.children.get(parts[k]);
      if (existing === undefined) {
        const d = newDir(parts[k], dir);
        dir.children.set(parts[k], d);
        dir = d;
      } else if (existing.kind === 'dir') {
        dir = existing;
      } else {
        fail(
          'ISO_PATH_DUPLICATE',
          `${field}: '${parts.slice(0, k + 1).join('/')}' is both a file and a directory`,
          field,
        );
      }
    }
    const leaf = parts[parts.length - 1];
    if (dir.children.has(leaf))
      fail(
        'ISO_PATH_DUPLICATE',
        `${field}: the path appears more than once (or is also a directory); each path must be unique`,
        field,
      );
    dir.children.set(leaf, {
      kind: 'file',
      name: leaf,
      data: f.data,
      mode: (f.mode ?? DEFAULT_FILE_MODE) & 0o7777,
      pId: EMPTY,
      jId: EMPTY,
      nm: EMPTY,
      nmInCe: null,
      lba: 0,
    });
  });
  return root;
}

// 8.3 d-character names, unique per directory (`META_DAT.;1`, `META_000.;1`).
function assignPrimaryNames(dir: DirNode): void {
  const taken = new Set<string>();
  const keyed: Array<{ node: Node; base: string; ext: string }> = [];
  const byRealName = [...dir.children.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const node of byRealName) {
    const upper = node.name.toUpperCase();
    let base = upper;
    let ext = '';
    const dot = upper.lastIndexOf('.');
    if (node.kind === 'file' && dot > 0) {
      base = upper.slice(0, dot);
      ext = upper.slice(dot + 1);
    }
    base = base.replace(/[^A-Z0-9_]/g, '_').slice(0, 8) || '_';
    ext = ext.replace(/[^A-Z0-9_]/g, '_').slice(0, 3);
    let candidate = base;
    for (let n = 0; taken.has(`${candidate}.${ext}`); n++) {
      const suffix = String(n).padStart(3, '0');
      candidate = base.slice(0, Math.max(0, 8 - suffix.length)) + suffix;
    }
    taken.add(`${candidate}.${ext}`);
    keyed.push({ node, base: candidate, ext });
  }
  // ECMA-119 9.3: by name, then extension (padding compares lowest).
  keyed.sort((a, b) => (a.base < b.base ? -1 : a.base > b.base ? 1 : a.ext < b.ext ? -1 : a.ext > b.ext ? 1 : 0));
  dir.pChildren = keyed.map((k) => {
    k.node.pId = ascii(k.node.kind === 'file' ? `${k.base}.${k.ext};1` : k.base);
    return k.node;
  });
  dir.jChildren = [...dir.children.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  let subdirs = 0;
  for (const c of dir.jChildren) {
    c.jId = ucs2(c.name);
    c.nm = utf8.encode(c.name);
    if (c.kind === 'dir') subdirs++;
  }
  dir.subdirs = subdirs;
}

function recordBase(idLen: number): number {
  return 33 + idLen + (idLen % 2 === 0 ? 1 : 0);
}

function even(n: number): number {
  return n + (n & 1);
}

// Directory records are placed so that none crosses a sector boundary.
function dirExtentSize(lengths: number[]): number {
  let sectors = 1;
  let off = 0;
  for (const len of lengths) {
    if (off + len > SECTOR) {
      sectors++;
      off = 0;
    }
    off += len;
  }
  return sectors * SECTOR;
}

function childRecLenPrimary(node: Node): number {
  const base = recordBase(node.pId.length) + PX_LEN + TF_LEN;
  return even(base + (node.nmInCe ? CE_LEN : NM_HEAD + node.nm.length));
}

// The root `.` carries SP, then the ER inline when the record stays within
// 255 bytes (it does: 34 + 7 + 144 + 36 + 26 + 5 = 252), else a CE to it.
const ROOT_DOT_INLINE_LEN = even(34 + SP_LEN + ER_LEN + PX_LEN + TF_LEN + NM_HEAD);
const ER_INLINE = ROOT_DOT_INLINE_LEN <= MAX_RECORD;
const ROOT_DOT_LEN = ER_INLINE ? ROOT_DOT_INLINE_LEN : even(34 + SP_LEN + CE_LEN + PX_LEN + TF_LEN + NM_HEAD);
const DOT_LEN = even(34 + PX_LEN + TF_LEN + NM_HEAD);

function childRecLenJoliet(node: Node): number {
  return recordBase(node.jId.length);
}

// Path table order (ECMA-119 9.4.2): breadth first, children sorted.
function pathOrder(root: DirNode, which: 'p' | 'j'): DirNode[] {
  const order: DirNode[] = [root];
  for (let i = 0; i < order.length; i++) {
    const kids = which === 'p' ? order[i].pChildren : order[i].jChildren;
    for (const c of kids) if (c.kind === 'dir') order.push(c);
  }
  return order;
}

function pathTableSize(order: DirNode[], which: 'p' | 'j'): number {
  let size = 0;
  for (const d of order) {
    const idLen = d.parent === null ? 1 : (which === 'p' ? d.pId : d.jId).length;
    size += 8 + idLen + (idLen & 1);
  }
  return size;
}

function sectorsFor(bytes: number): number {
  return Math.ceil(bytes / SECTOR);
}

function validateLabel(label: string): void {
  if (typeof label !== 'string' || !LABEL_RE.test(label)) {
    fail(
      'ISO_LABEL_INVALID',
      `label: must be 1-${MAX_LABEL} characters of A-Z a-z 0-9 _ . - (cloud-init matches 'cidata' or 'config-2' exactly)`,
      'label',
    );
  }
}

export function buildIso(input: IsoInput): Uint8Array {
  const { label, files, timestamp } = input;
  validateLabel(label);
  validateTimestamp(timestamp);
  const root = buildTree(files);
  const { pOrder, jOrder } = nameTree(root);
  for (const d of pOrder) planContinuation(d);
  const layout = placeExtents(pOrder, jOrder);
  return writeImage(label, timestamp, root, pOrder, jOrder, layout);
}

function validateTimestamp(timestamp: Date): void {
  const t = timestamp instanceof Date ? timestamp.getTime() : NaN;
  if (!Number.isFinite(t) || timestamp.getUTCFullYear() < 1970 || timestamp.getUTCFullYear() > 2155) {
    fail('ISO_TIMESTAMP_INVALID', 'timestamp: must be a valid date between 1970 and 2155', 'timestamp');
  }
}

// Names and orderings, depth first over every directory; the directories
// in path-table order of each tree, numbered.
function nameTree(root: DirNode): { pOrder: DirNode[]; jOrder: DirNode[] } {
  const stack: DirNode[] = [root];
  while (stack.length) {
    const d = stack.pop()!;
    assignPrimaryNames(d);
    for (const c of d.pChildren) if (c.kind === 'dir') stack.push(c);
  }
  const pOrder = pathOrder(root, 'p');
  const jOrder = pathOrder(root, 'j');
  pOrder.forEach((d, i) => (d.pNum = i + 1));
  jOrder.forEach((d, i) => (d.jNum = i + 1));
  return { pOrder, jOrder };
}

// A directory's continuation area (sectors relative to its area): the
// root's starts with the ER; NM entries too long to stay inline follow.
function planContinuation(d: DirNode): void {
  let sector = 0;
  const erHere = d.parent === null && !ER_INLINE;
  let offset = erHere ? ER_LEN : 0;
  let used = erHere;
  for (const c of d.pChildren) {
    const inline = even(recordBase(c.pId.length) + PX_LEN + TF_LEN + NM_HEAD + c.nm.length);
    if (inline <= MAX_RECORD) continue;
    const need = NM_HEAD + c.nm.length;
    if (offset + need > SECTOR) {
      sector++;
      offset = 0;
    }
    c.nmInCe = { sector, offset };
    offset += need;
    used = true;
  }
  d.ceSectors = used ? sector + 1 : 0;
}

interface Layout {
  pPtSize: number;
  jPtSize: number;
  pLTable: number;
  pMTable: number;
  jLTable: number;
  jMTable: number;
  fileOrder: FileNode[];
  total: number;
}

// Where everything goes: path tables, directory extents (with their
// continuation areas), then the files' data, in sectors.
function placeExtents(pOrder: DirNode[], jOrder: DirNode[]): Layout {
  let next = FIRST_FREE_SECTOR;
  const pPtSize = pathTableSize(pOrder, 'p');
  const jPtSize = pathTableSize(jOrder, 'j');
  const pPtSectors = sectorsFor(pPtSize);
  const jPtSectors = sectorsFor(jPtSize);
  const pLTable = next;
  const pMTable = pLTable + pPtSectors;
  const jLTable = pMTable + pPtSectors;
  const jMTable = jLTable + jPtSectors;
  next = jMTable + jPtSectors;

  for (const d of pOrder) {
    const lens = [d.parent === null ? ROOT_DOT_LEN : DOT_LEN, DOT_LEN];
    for (const c of d.pChildren) lens.push(childRecLenPrimary(c));
    d.pSize = dirExtentSize(lens);
    d.pLba = next;
    next += d.pSize / SECTOR;
    d.ceLba = next;
    next += d.ceSectors;
  }
  for (const d of jOrder) {
    const lens = [34, 34];
    for (const c of d.jChildren) lens.push(childRecLenJoliet(c));
    d.jSize = dirExtentSize(lens);
    d.jLba = next;
    next += d.jSize / SECTOR;
  }
  const fileOrder: FileNode[] = [];
  for (const d of pOrder) {
    for (const c of d.pChildren) {
      if (c.kind !== 'file') continue;
      // Empty files point at the next free sector with length 0, as genisoimage does.
      c.lba = next;
      next += sectorsFor(c.data.length);
      fileOrder.push(c);
    }
  }
  const total = Math.max(MIN_SECTORS, next + (next & 1)); // a multiple of 4096 bytes
  if (total >= MAX_SECTORS) {
    fail(
      'ISO_TOO_LARGE',
      `files: the image would be ${total} sectors; it must stay under ${MAX_SECTORS} (128 MiB, cloudbase-init reads 16 bits of the volume size)`,
      'files',
    );
  }
  return { pPtSize, jPtSize, pLTable, pMTable, jLTable, jMTable, fileOrder, total };
}

function writeImage(
  label: string,
  timestamp: Date,
  root: DirNode,
  pOrder: DirNode[],
  jOrder: DirNode[],
  l: Layout,
): Uint8Array {
  const buf = new Uint8Array(l.total * SECTOR);
  const w = new Writer(buf, timestamp);

  w.volumeDescriptor(16 * SECTOR, 1, label, l.total, l.pPtSize, l.pLTable, l.pMTable, root, false);
  w.volumeDescriptor(17 * SECTOR, 2, label, l.total, l.jPtSize, l.jLTable, l.jMTable, root, true);
  buf[18 * SECTOR] = 255;
  buf.set(CD001, 18 * SECTOR + 1);
  buf[18 * SECTOR + 6] = 1;

  if (!ER_INLINE) w.er(root.ceLba * SECTOR);
  w.pathTables(pOrder, l.pLTable * SECTOR, l.pMTable * SECTOR, false);
  w.pathTables(jOrder, l.jLTable * SECTOR, l.jMTable * SECTOR, true);

  for (const d of pOrder) w.primaryDir(d);
  for (const d of jOrder) w.jolietDir(d);
  for (const f of l.fileOrder) buf.set(f.data, f.lba * SECTOR);
  return buf;
}

const CD001 = ascii('CD001');

class Writer {
  readonly buf: Uint8Array;
  readonly recDate: Uint8Array;
  readonly vdDate: Uint8Array;

  constructor(buf: Uint8Array, ts: Date) {
    this.buf = buf;
    this.recDate = Uint8Array.of(
      ts.getUTCFullYear() - 1900,
      ts.getUTCMonth() + 1,
      ts.getUTCDate(),
      ts.getUTCHours(),
      ts.getUTCMinutes(),
      ts.getUTCSeconds(),
      0,
    );
    const p = (n: number, w: number) => String(n).padStart(w, '0');
    const digits =
      p(ts.getUTCFullYear(), 4) +
      p(ts.getUTCMonth() + 1, 2) +
      p(ts.getUTCDate(), 2) +
      p(ts.getUTCHours(), 2) +
      p(ts.getUTCMinutes(), 2) +
      p(ts.getUTCSeconds(), 2) +
      p(Math.floor(ts.getUTCMilliseconds() / 10), 2);
    this.vdDate = new Uint8Array(17);
    this.vdDate.set(ascii(digits));
  }

  u16both(off: number, v: number): void {
    const b = this.buf;
    b[off] = v & 0xff;
    b[off + 1] = (v >> 8) & 0xff;
    b[off + 2] = (v >> 8) & 0xff;
    b[off + 3] = v & 0xff;
  }

  u32le(off: number, v: number): void {
    const b = this.buf;
    b[off] = v & 0xff;
    b[off + 1] = (v >>> 8) & 0xff;
    b[off + 2] = (v >>> 16) & 0xff;
    b[off + 3] = (v >>> 24) & 0xff;
  }

  u32be(off: number, v: number): void {
    const b = this.buf;
    b[off] = (v >>> 24) & 0xff;
    b[off + 1] = (v >>> 16) & 0xff;
    b[off + 2] = (v >>> 8) & 0xff;
    b[off + 3] = v & 0xff;
  }

  u32both(off: number, v: number): void {
    this.u32le(off, v);
    this.u32be(off + 4, v);
  }

  // Space-padded text field: ASCII (primary) or UCS-2 BE (Joliet).
  text(off: number, len: number, s: string, joliet: boolean): void {
    const b = this.buf;
    if (joliet) {
      for (let i = 0; i + 1 < len; i += 2) {
        const c = i / 2 < s.length ? s.charCodeAt(i / 2) : 0x20;
        b[off + i] = c >> 8;
        b[off + i + 1] = c & 0xff;
      }
    } else {
      for (let i = 0; i < len; i++) b[off + i] = i < s.length ? s.charCodeAt(i) : 0x20;
    }
  }

  volumeDescriptor(
    off: number,
    type: 1 | 2,
    label: string,
    total: number,
    ptSize: number,
    lTable: number,
    mTable: number,
    root: DirNode,
    joliet: boolean,
  ): void {
    const b = this.buf;
    b[off] = type;
    b.set(CD001, off + 1);
    b[off + 6] = 1;
    this.text(off + 8, 32, '', joliet); // system id
    // The label verbatim: the PVD holds up to 32 chars; Joliet's 32 bytes hold
    // 16, and blkid merges the two (case from Joliet, rest from the PVD).
    this.text(off + 40, 32, label, joliet);
    this.u32both(off + 80, total);
    if (joliet) b.set(ascii('%/E'), off + 88);
    this.u16both(off + 120, 1);
    this.u16both(off + 124, 1);
    this.u16both(off + 128, SECTOR);
    this.u32both(off + 132, ptSize);
    this.u32le(off + 140, lTable);
    this.u32be(off + 148, mTable);
    this.record(off + 156, joliet ? root.jLba : root.pLba, joliet ? root.jSize : root.pSize, true, DOT, 34);
    this.text(off + 190, 128, '', joliet); // volume set
    this.text(off + 318, 128, '', joliet); // publisher
    this.text(off + 446, 128, '', joliet); // preparer
    this.text(off + 574, 128, 'VMSEED', joliet); // application
    this.text(off + 702, 37, '', joliet);
    this.text(off + 739, 37, '', joliet);
    this.text(off + 776, 37, '', joliet); // in Joliet the odd 37th byte stays 0, as genisoimage leaves it
    b.set(this.vdDate, off + 813); // creation
    b.set(this.vdDate, off + 830); // modification
    b.fill(0x30, off + 847, off + 863); // expiration: unset
    b.fill(0x30, off + 864, off + 880); // effective: unset
    b[off + 881] = 1;
  }

  // Directory record without System Use; returns the offset where SU starts.
  record(off: number, extent: number, size: number, dir: boolean, id: Uint8Array, len: number): number {
    const b = this.buf;
    b[off] = len;
    this.u32both(off + 2, extent);
    this.u32both(off + 10, size);
    b.set(this.recDate, off + 18);
    b[off + 25] = dir ? 2 : 0;
    this.u16both(off + 28, 1);
    b[off + 32] = id.length;
    b.set(id, off + 33);
    return off + 33 + id.length + (id.length % 2 === 0 ? 1 : 0);
  }

  // Every SUSP entry starts with its two-letter signature, its length and
  // version 1 (IEEE P1281 4.1).
  susp(off: number, sig: string, len: number): void {
    const b = this.buf;
    b[off] = sig.charCodeAt(0);
    b[off + 1] = sig.charCodeAt(1);
    b[off + 2] = len;
    b[off + 3] = 1;
  }

  px(off: number, mode: number, nlink: number): number {
    this.susp(off, 'PX', PX_LEN);
    this.u32both(off + 4, mode);
    this.u32both(off + 12, nlink);
    // uid and gid 0: already zero.
    return off + PX_LEN;
  }

  tf(off: number): number {
    const b = this.buf;
    this.susp(off, 'TF', TF_LEN);
    b[off + 4] = 0x0e;
    b.set(this.recDate, off + 5);
    b.set(this.recDate, off + 12);
    b.set(this.recDate, off + 19);
    return off + TF_LEN;
  }

  nm(off: number, flags: number, name: Uint8Array): number {
    const b = this.buf;
    this.susp(off, 'NM', NM_HEAD + name.length);
    b[off + 4] = flags;
    b.set(name, off + 5);
    return off + NM_HEAD + name.length;
  }

  ce(off: number, sector: number, offset: number, length: number): number {
    this.susp(off, 'CE', CE_LEN);
    this.u32both(off + 4, sector);
    this.u32both(off + 12, offset);
    this.u32both(off + 20, length);
    return off + CE_LEN;
  }

  er(off: number): void {
    const b = this.buf;
    this.susp(off, 'ER', ER_LEN);
    b[off + 4] = ER_ID.length;
    b[off + 5] = ER_DES.length;
    b[off + 6] = ER_SRC.length;
    b[off + 7] = 1;
    b.set(ER_TEXT, off + 8);
  }

  pathTables(order: DirNode[], lOff: number, mOff: number, joliet: boolean): void {
    const b = this.buf;
    let l = lOff;
    let m = mOff;
    for (const d of order) {
      const id = d.parent === null ? DOT : joliet ? d.jId : d.pId;
      const lba = joliet ? d.jLba : d.pLba;
      const parent = d.parent === null ? 1 : joliet ? d.parent.jNum : d.parent.pNum;
      const len = 8 + id.length + (id.length & 1);
      b[l] = id.length;
      b[m] = id.length;
      this.u32le(l + 2, lba);
      this.u32be(m + 2, lba);
      b[l + 6] = parent & 0xff;
      b[l + 7] = parent >> 8;
      b[m + 6] = parent >> 8;
      b[m + 7] = parent & 0xff;
      b.set(id, l + 8);
      b.set(id, m + 8);
      l += len;
      m += len;
    }
  }

  primaryDir(d: DirNode): void {
    const start = d.pLba * SECTOR;
    let off = start;
    const place = (len: number): number => {
      const inSector = (off - start) % SECTOR;
      if (inSector + len > SECTOR) off += SECTOR - inSector;
      const at = off;
      off += len;
      return at;
    };
    const dirMode = S_IFDIR | DIR_MODE;
    // `.`: in the root it carries SP first, then the ER (or a CE to it).
    const isRoot = d.parent === null;
    let at = place(isRoot ? ROOT_DOT_LEN : DOT_LEN);
    let su = this.record(at, d.pLba, d.pSize, true, DOT, isRoot ? ROOT_DOT_LEN : DOT_LEN);
    if (isRoot) {
      this.buf.set(SP_ENTRY, su);
      su += SP_LEN;
      if (ER_INLINE) {
        this.er(su);
        su += ER_LEN;
      } else {
        su = this.ce(su, d.ceLba, 0, ER_LEN);
      }
    }
    this.nm(this.tf(this.px(su, dirMode, 2 + d.subdirs)), 0x02, EMPTY);
    const parent = d.parent ?? d;
    at = place(DOT_LEN);
    su = this.record(at, parent.pLba, parent.pSize, true, DOTDOT, DOT_LEN);
    this.nm(this.tf(this.px(su, dirMode, 2 + parent.subdirs)), 0x04, EMPTY);
    for (const c of d.pChildren) {
      const len = childRecLenPrimary(c);
      at = place(len);
      su =
        c.kind === 'dir'
          ? this.record(at, c.pLba, c.pSize, true, c.pId, len)
          : this.record(at, c.lba, c.data.length, false, c.pId, len);
      su = this.tf(c.kind === 'dir' ? this.px(su, dirMode, 2 + c.subdirs) : this.px(su, S_IFREG | c.mode, 1));
      if (c.nmInCe) {
        const sector = d.ceLba + c.nmInCe.sector;
        this.ce(su, sector, c.nmInCe.offset, NM_HEAD + c.nm.length);
        this.nm(sector * SECTOR + c.nmInCe.offset, 0, c.nm);
      } else {
        this.nm(su, 0, c.nm);
      }
    }
  }

  jolietDir(d: DirNode): void {
    const start = d.jLba * SECTOR;
    let off = start;
    const place = (len: number): number => {
      const inSector = (off - start) % SECTOR;
      if (inSector + len > SECTOR) off += SECTOR - inSector;
      const at = off;
      off += len;
      return at;
    };
    this.record(place(34), d.jLba, d.jSize, true, DOT, 34);
    const parent = d.parent ?? d;
    this.record(place(34), parent.jLba, parent.jSize, true, DOTDOT, 34);
    for (const c of d.jChildren) {
      const len = childRecLenJoliet(c);
      const at = place(len);
      if (c.kind === 'dir') this.record(at, c.jLba, c.jSize, true, c.jId, len);
      else this.record(at, c.lba, c.data.length, false, c.jId, len);
    }
  }
}

const ER_TEXT = ascii(ER_ID + ER_DES + ER_SRC);
const SP_ENTRY = Uint8Array.of(0x53, 0x50, SP_LEN, 1, 0xbe, 0xef, 0);
