// A real pino logger whose lines are kept in memory, so tests can assert
// what was (and was not) logged.
import { Writable } from 'node:stream';
import pino from 'pino';

export function captureLogger(level: pino.Level = 'debug'): { logger: pino.Logger; lines: string[] } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      lines.push(...String(chunk).split('\n').filter(Boolean));
      cb();
    },
  });
  return { logger: pino({ level }, sink), lines };
}
