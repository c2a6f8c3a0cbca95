// Parses what the busybox guest's /init prints on the serial console.
export interface ConsoleResult {
  files: Map<string, Buffer>;
  missing: string[];
  labelFound?: { dev: string; uptime: number };
  /** Guest uptime (s) when the seed disappeared (vmseed.after=stay). */
  labelGoneUptime?: number;
  labelTimeout: boolean;
  done: boolean;
}

const BASE64_LINE = /^[A-Za-z0-9+/=]+$/;

export function parseConsole(text: string): ConsoleResult {
  const files = new Map<string, Buffer>();
  const missing: string[] = [];
  const result: ConsoleResult = { files, missing, labelTimeout: false, done: false };
  let current: string | undefined;
  let chunks: string[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.replace(/\r/g, '').trimEnd();
    if (current !== undefined) {
      if (line === `VMSEED-FILE-END ${current}`) {
        files.set(current, Buffer.from(chunks.join(''), 'base64'));
        current = undefined;
        chunks = [];
      } else if (BASE64_LINE.test(line)) {
        chunks.push(line);
      }
      // Anything else inside a file block is a stray console line; skip it.
      continue;
    }
    let m: RegExpExecArray | null;
    if ((m = /^VMSEED-FILE-BEGIN (.+)$/.exec(line))) {
      current = m[1];
      chunks = [];
    } else if ((m = /^VMSEED-FILE-MISSING (.+)$/.exec(line))) {
      missing.push(m[1]);
    } else if ((m = /^VMSEED-LABEL-FOUND (\S+) ([0-9.]+)$/.exec(line))) {
      result.labelFound ??= { dev: m[1], uptime: Number(m[2]) };
    } else if ((m = /^VMSEED-LABEL-GONE ([0-9.]+)$/.exec(line))) {
      result.labelGoneUptime = Number(m[1]);
    } else if (/^VMSEED-LABEL-TIMEOUT /.test(line)) {
      result.labelTimeout = true;
    } else if (/^VMSEED-DONE\b/.test(line)) {
      result.done = true;
    }
  }
  return result;
}
