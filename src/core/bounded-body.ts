// A request body read whole, up to a cap, for listeners whose clients may
// be hostile. The cap is checked as the body arrives (a chunked body has no
// length to check first): past it nothing more is kept and the request is
// paused, so the caller answers and drops the connection with the rest
// unread. No deadline of its own: the server's socket timeouts end a body
// that stops coming, and the request's close ends the read.
import type { Readable } from 'node:stream';

/** Why a body was not read: more than the cap came, or the request ended (errored, closed) first. */
export type BodyRefusal = 'too-large' | 'aborted';

/**
 * The whole body of `req`, or 'too-large' as soon as more than `max` bytes
 * came (`req` is then paused), or 'aborted'. An announced Content-Length is
 * the caller's to check before.
 */
export function readBoundedBody(req: Readable, max: number): Promise<Buffer | BodyRefusal> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const end = (v: Buffer | BodyRefusal) => {
      if (done) return;
      done = true;
      resolve(v);
    };
    req.on('data', (chunk: Buffer) => {
      if (done) return;
      size += chunk.length;
      if (size > max) {
        chunks.length = 0;
        req.pause();
        end('too-large');
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => end(Buffer.concat(chunks, size)));
    req.on('error', () => end('aborted'));
    req.on('close', () => end('aborted'));
  });
}
