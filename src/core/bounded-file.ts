// A small text file read whole, bounded: a regular file only (a FIFO or a
// device would block or never end), refused past `maxBytes` before a byte of
// it is read. For data files the program reads once (cloud-init's schemas).
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';

/** Reads `file` as UTF-8; throws the open's error (with its `code`), or an Error saying why it is refused. */
export function readTextFileBounded(file: string, maxBytes: number): string {
  const fd = openSync(file, 'r');
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new Error('not a regular file');
    if (st.size > maxBytes) throw new Error(`larger than ${maxBytes} bytes`);
    const buf = Buffer.alloc(st.size);
    let off = 0;
    while (off < buf.length) {
      const n = readSync(fd, buf, off, buf.length - off, off);
      if (n === 0) break;
      off += n;
    }
    return buf.subarray(0, off).toString('utf8');
  } finally {
    closeSync(fd);
  }
}
