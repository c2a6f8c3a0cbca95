// A connection held after a refusal: its next request is not read before
// the hold ends, while other connections are answered; a pipelined burst
// does not lengthen the hold; what the client sends meanwhile stays in the
// kernel, not in the server's memory; a connection closed while held
// leaves nothing behind.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { once } from 'node:events';
import { holdConnection } from '../../src/datasource/flood/connection-hold.ts';

const HOLD_MS = 1000;

// Answers every request with its path; `/refuse` is answered 429 and holds
// its connection.
async function server(): Promise<{ srv: Server; port: number; sockets: Socket[] }> {
  const sockets: Socket[] = [];
  const srv = createServer((req, res) => {
    if (req.url === '/refuse') holdConnection(req, res, HOLD_MS);
    res.writeHead(req.url === '/refuse' ? 429 : 200, { 'Content-Length': String(req.url!.length) });
    res.end(req.url);
  });
  srv.on('connection', (s: Socket) => sockets.push(s));
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  return { srv, port: (srv.address() as AddressInfo).port, sockets };
}

// One keep-alive connection; each answer is timed when its last byte arrives.
function client(port: number) {
  const socket = connect(port, '127.0.0.1');
  socket.on('error', () => {});
  let buffered = '';
  const waiting: Array<(a: { status: number; at: number }) => void> = [];
  socket.on('data', (chunk: Buffer) => {
    buffered += chunk.toString('latin1');
    for (;;) {
      const head = buffered.indexOf('\r\n\r\n');
      if (head < 0) return;
      const length = Number(/content-length: (\d+)/i.exec(buffered.slice(0, head))![1]);
      if (buffered.length < head + 4 + length) return;
      const status = Number(buffered.slice(9, 12));
      buffered = buffered.slice(head + 4 + length);
      waiting.shift()!({ status, at: performance.now() });
    }
  });
  const send = (...paths: string[]) => {
    const answers = paths.map(() => new Promise<{ status: number; at: number }>((r) => waiting.push(r)));
    socket.write(paths.map((p) => `GET ${p} HTTP/1.1\r\nHost: x\r\n\r\n`).join(''));
    return answers;
  };
  return { socket, send };
}

async function stop(srv: Server): Promise<void> {
  srv.closeAllConnections();
  srv.close();
  await once(srv, 'close');
}

test(
  'the next request on a held connection waits for the hold; other connections do not',
  { timeout: 30_000 },
  async () => {
    const { srv, port } = await server();
    const held = client(port);
    const other = client(port);
    try {
      const [refused] = held.send('/refuse');
      const r = await refused;
      assert.equal(r.status, 429);
      const [next] = held.send('/next');
      const [meanwhile] = other.send('/other');
      const m = await meanwhile;
      const n = await next;
      assert.equal(m.status, 200);
      assert.equal(n.status, 200, 'read and answered once the hold ends');
      assert.ok(m.at < n.at, 'another connection is answered while this one is held');
      // The hold starts when the 429 is on the wire, before the client has it.
      assert.ok(n.at - r.at >= HOLD_MS / 2, `answered ${(n.at - r.at).toFixed(0)} ms after the refusal`);
    } finally {
      held.socket.destroy();
      other.socket.destroy();
      await stop(srv);
    }
  },
);

test(
  'a pipelined burst of refusals holds once, not once per refusal; a released hold leaves no listener',
  { timeout: 30_000 },
  async () => {
    const { srv, port, sockets } = await server();
    const c = client(port);
    try {
      await c.send('/before')[0];
      const listeners = sockets[0].listenerCount('close');
      const [first] = c.send('/refuse');
      const f = await first;
      // Four refusals pipelined behind a hold: each is read when the hold ends.
      const answers = await Promise.all(c.send('/refuse', '/refuse', '/refuse', '/refuse'));
      assert.deepEqual(
        answers.map((a) => a.status),
        [429, 429, 429, 429],
      );
      const [after] = c.send('/after');
      const a = await after;
      // The first hold, then one more started by the burst's first refusal
      // (each at most 2 * HOLD_MS): not one per refusal.
      assert.ok(a.at - f.at < 5 * HOLD_MS, `last answer ${(a.at - f.at).toFixed(0)} ms after the first refusal`);
      assert.equal(a.status, 200);
      assert.equal(sockets[0].listenerCount('close'), listeners, 'no listener left per hold');
    } finally {
      c.socket.destroy();
      await stop(srv);
    }
  },
);

test('what a held client sends stays in the kernel, not in the server', { timeout: 30_000 }, async () => {
  const { srv, port, sockets } = await server();
  const c = client(port);
  try {
    const [refused] = c.send('/refuse');
    await refused;
    const serverSide = sockets[0];
    const readBefore = serverSide.bytesRead;
    // 1 MiB of pipelined requests while the connection is held.
    const request = 'GET /flood HTTP/1.1\r\nHost: x\r\n\r\n';
    c.socket.write(request.repeat(Math.ceil((1 << 20) / request.length)));
    await new Promise((r) => setTimeout(r, HOLD_MS / 4));
    assert.equal(serverSide.bytesRead, readBefore, 'nothing read from a held connection');
  } finally {
    c.socket.destroy();
    await stop(srv);
  }
});
