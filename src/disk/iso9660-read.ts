// Reader for seed images: ours, genisoimage's, xorrisofs's. Names come from
// Rock Ridge when present, else Joliet, else the primary tree (version
// suffix stripped). Used by `vmseed inspect` and by the tests. Pure.
import { VmseedError } from '../errors.ts';

const SECTOR = 2048;
const MAX_ENTRIES = 100_000;
const MAX_CE_HOPS = 64;

export type NameSource = 'rockridge' | 'joliet' | 'primary';

export interface IsoEntry {
  path: string;
  kind: 'file' | 'dir';
  size: number;
  // Rock Ridge permission bits and type, when present.
  mode?: number;
}

/** An ISO 9660 image as read: labels, extensions, the tree and each file's bytes. */
export interface IsoImage {
  // The label blkid reports: the Joliet volume id merged with the PVD's.
  label: string;
  primaryLabel: string;
  jolietLabel?: string;
  volumeSectors: number;
  extensions: { joliet: boolean; rockRidge: boolean };
  namesFrom: NameSource;
  // Files and directories, sorted by path, without the root.
  entries: IsoEntry[];
  // A file's bytes (a view into the image), or undefined when there is none.
  read(path: string): Uint8Array | undefined;
}

interface RawRecord {
  extent: number;
  size: number;
  dir: boolean;
  id: Uint8Array;
  su: Uint8Array;
}

interface Rock {
  name?: string;
  mode?: number;
  relocated: boolean;
  childLink?: number;
  sp: boolean;
  er: boolean;
}

function bad(message: string): never {
  throw new VmseedError('ISO_NOT_AN_IMAGE', `image: ${message}; is this an ISO 9660 image?`, { field: 'image' });
}

function u32le(b: Uint8Array, off: number): number {
  return (b[off] | (b[off + 1] << 8) | (b[off + 2] << 16) | (b[off + 3] << 24)) >>> 0;
}

function text(b: Uint8Array, off: number, len: number): string {
  let s = '';
  for (let i = 0; i < len; i++) s += String.fromCharCode(b[off + i]);
  return s.replace(/[\s\0]+$/, '');
}

function ucs2(b: Uint8Array, off: number, len: number): string {
  let s = '';
  for (let i = 0; i + 1 < len; i += 2) s += String.fromCharCode((b[off + i] << 8) | b[off + i + 1]);
  return s;
}

const utf8 = new TextDecoder('utf-8');

class Reader {
  readonly b: Uint8Array;
  entries = 0;

  constructor(b: Uint8Array) {
    this.b = b;
  }

  slice(lba: number, offset: number, len: number): Uint8Array {
    const start = lba * SECTOR + offset;
    if (lba < 0 || start + len > this.b.length || len < 0) bad(`an extent (sector ${lba}) lies outside the image`);
    return this.b.subarray(start, start + len);
  }

  records(extent: number, size: number): RawRecord[] {
    const data = this.slice(extent, 0, size);
    const out: RawRecord[] = [];
    let off = 0;
    while (off < data.length) {
      const len = data[off];
      if (len === 0) {
        off = (Math.floor(off / SECTOR) + 1) * SECTOR;
        continue;
      }
      if (len < 34 || off + len > data.length) bad('a directory record is malformed');
      const idLen = data[off + 32];
      if (33 + idLen > len) bad('a directory record identifier overflows its record');
      const suStart = 33 + idLen + (idLen % 2 === 0 ? 1 : 0);
      out.push({
        extent: u32le(data, off + 2),
        size: u32le(data, off + 10),
        dir: (data[off + 25] & 2) !== 0,
        id: data.subarray(off + 33, off + 33 + idLen),
        su: data.subarray(Math.min(off + suStart, off + len), off + len),
      });
      if (++this.entries > MAX_ENTRIES) bad('too many directory records');
      off += len;
    }
    return out;
  }

  // SUSP entries, following CE continuation areas.
  rock(su: Uint8Array, skip: number): Rock {
    const r: Rock = { relocated: false, sp: false, er: false };
    let area: Uint8Array | undefined = su.subarray(Math.min(skip, su.length));
    let name: string[] | undefined;
    let hops = 0;
    while (area) {
      let ce: Uint8Array | undefined;
      let off = 0;
      while (off + 4 <= area.length) {
        const sig = String.fromCharCode(area[off], area[off + 1]);
        const len = area[off + 2];
        if (len < 4 || off + len > area.length) break;
        const e = area.subarray(off, off + len);
        if (sig === 'SP' && len >= 7 && e[4] === 0xbe && e[5] === 0xef) r.sp = true;
        else if (sig === 'ER') r.er = true;
        else if (sig === 'NM' && len >= 5) {
          const flags = e[4];
          if ((flags & 6) === 0) (name ??= []).push(utf8.decode(e.subarray(5)));
        } else if (sig === 'PX' && len >= 12) r.mode = u32le(e, 4);
        else if (sig === 'RE') r.relocated = true;
        else if (sig === 'CL' && len >= 12) r.childLink = u32le(e, 4);
        else if (sig === 'CE' && len >= 28) {
          if (++hops > MAX_CE_HOPS) bad('too many Rock Ridge continuation areas');
          ce = this.slice(u32le(e, 4), u32le(e, 12), u32le(e, 20));
        } else if (sig === 'ST') break;
        off += len;
      }
      area = ce;
    }
    if (name) r.name = name.join('');
    return r;
  }
}

function primaryName(id: Uint8Array): string {
  let s = text(id, 0, id.length);
  const semi = s.indexOf(';');
  if (semi >= 0) s = s.slice(0, semi);
  if (s.endsWith('.')) s = s.slice(0, -1);
  return s;
}

function jolietName(id: Uint8Array): string {
  let s = ucs2(id, 0, id.length);
  const semi = s.lastIndexOf(';');
  if (semi >= 0 && /^;\d+$/.test(s.slice(semi))) s = s.slice(0, semi);
  return s;
}

/**
 * Reads a seed image (ours, genisoimage's, xorrisofs's) from its bytes; throws
 * ISO_NOT_AN_IMAGE when they are not a readable ISO 9660 image.
 */
export function readIso(bytes: Uint8Array): IsoImage {
  if (bytes.length < 17 * SECTOR)
    bad(`it is ${bytes.length} bytes, smaller than the 16-sector system area plus a descriptor`);
  const r = new Reader(bytes);
  let pvd: number | undefined;
  let svd: number | undefined;
  for (let s = 16; (s + 1) * SECTOR <= bytes.length && s < 16 + 64; s++) {
    const off = s * SECTOR;
    if (text(bytes, off + 1, 5) !== 'CD001') {
      if (s === 16) bad('no CD001 volume descriptor at sector 16');
      break;
    }
    const type = bytes[off];
    if (type === 255) break;
    if (type === 1 && pvd === undefined) pvd = off;
    if (type === 2 && svd === undefined) {
      const esc = text(bytes, off + 88, 3);
      if (esc === '%/@' || esc === '%/C' || esc === '%/E') svd = off;
    }
  }
  if (pvd === undefined) bad('no primary volume descriptor');
  const primaryLabel = text(bytes, pvd + 40, 32);
  const jolietLabel = svd === undefined ? undefined : ucs2(bytes, svd + 40, 32).replace(/[\s\0]+$/, '');
  // blkid: Joliet's (at most 16) characters, then the PVD's remainder.
  let label = primaryLabel;
  if (jolietLabel !== undefined && primaryLabel.toUpperCase().startsWith(jolietLabel.toUpperCase())) {
    label = jolietLabel + primaryLabel.slice(jolietLabel.length);
  } else if (jolietLabel) {
    label = jolietLabel;
  }
  const volumeSectors = u32le(bytes, pvd + 80);

  const rootOf = (vd: number): { extent: number; size: number } => ({
    extent: u32le(bytes, vd + 156 + 2),
    size: u32le(bytes, vd + 156 + 10),
  });
  const pRoot = rootOf(pvd);
  const rootRecords = r.records(pRoot.extent, pRoot.size);
  const rootDot = rootRecords[0];
  if (!rootDot || rootDot.id.length !== 1 || rootDot.id[0] !== 0)
    bad('the root directory does not start with its "." record');
  let skip = 0;
  let rockRidge = false;
  if (
    rootDot.su.length >= 7 &&
    rootDot.su[0] === 0x53 &&
    rootDot.su[1] === 0x50 &&
    rootDot.su[4] === 0xbe &&
    rootDot.su[5] === 0xef
  ) {
    skip = rootDot.su[6];
    const rr = r.rock(rootDot.su, 0);
    rockRidge = rr.er || rr.mode !== undefined;
  }
  const namesFrom: NameSource = rockRidge ? 'rockridge' : svd !== undefined ? 'joliet' : 'primary';
  const treeRoot = namesFrom === 'joliet' ? rootOf(svd!) : pRoot;

  const entries: IsoEntry[] = [];
  const files = new Map<string, { extent: number; size: number }>();
  const seen = new Set<number>();
  const walk = (extent: number, size: number, prefix: string, depth: number): void => {
    if (seen.has(extent)) bad('a directory appears twice (a loop)');
    if (depth > 64) bad('directories nest too deeply');
    seen.add(extent);
    const recs = extent === pRoot.extent && namesFrom !== 'joliet' ? rootRecords : r.records(extent, size);
    for (const rec of recs) {
      if (rec.id.length === 1 && (rec.id[0] === 0 || rec.id[0] === 1)) continue;
      let name: string;
      let mode: number | undefined;
      let dir = rec.dir;
      let childExtent = rec.extent;
      let childSize = rec.size;
      if (namesFrom === 'rockridge') {
        const rock = r.rock(rec.su, skip);
        if (rock.relocated) continue;
        name = rock.name ?? primaryName(rec.id);
        mode = rock.mode;
        if (rock.childLink !== undefined) {
          dir = true;
          childExtent = rock.childLink;
          const dot = r.records(childExtent, SECTOR)[0];
          if (!dot) bad('a Rock Ridge child link points at nothing');
          childSize = dot.size;
        }
      } else {
        name = namesFrom === 'joliet' ? jolietName(rec.id) : primaryName(rec.id);
      }
      const path = prefix + name;
      if (dir) {
        entries.push({ path, kind: 'dir', size: 0, ...(mode === undefined ? {} : { mode }) });
        walk(childExtent, childSize, path + '/', depth + 1);
      } else {
        r.slice(rec.extent, 0, rec.size);
        entries.push({ path, kind: 'file', size: rec.size, ...(mode === undefined ? {} : { mode }) });
        files.set(path, { extent: rec.extent, size: rec.size });
      }
    }
  };
  walk(treeRoot.extent, treeRoot.size, '', 0);
  entries.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));

  return {
    label,
    primaryLabel,
    ...(jolietLabel === undefined ? {} : { jolietLabel }),
    volumeSectors,
    extensions: { joliet: svd !== undefined, rockRidge },
    namesFrom,
    entries,
    read(path: string): Uint8Array | undefined {
      const f = files.get(path.replace(/^\/+/, ''));
      return f ? r.slice(f.extent, 0, f.size) : undefined;
    },
  };
}
