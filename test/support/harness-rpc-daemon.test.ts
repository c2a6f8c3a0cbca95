// Harness test (of the fakes, not of vmseed): the handshake daemon answers
// as libvirtd does where the agent's client depends on it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { handshakeDaemon } from './fake-rpc-daemon.ts';
import { until } from './hostile-rpc-daemon.ts';
import {
  FrameSplitter,
  KEEPALIVE_PROC,
  PROGRAM,
  STATUS,
  TYPE,
  frame,
  unframe,
  type WirePacket,
} from './libvirt-wire.ts';

test('the handshake fake tells a keepalive PING from CONNECT_OPEN (both procedure 1) by program', async () => {
  const fake = await handshakeDaemon([0]);
  const sock = connect(fake.path);
  try {
    const splitter = new FrameSplitter();
    const answers: WirePacket[] = [];
    sock.on('data', (c: Buffer) => answers.push(...splitter.push(c).map(unframe)));
    const header = { vers: 1, proc: 1, type: TYPE.MESSAGE, serial: 0, status: STATUS.OK };
    sock.write(frame({ ...header, prog: PROGRAM.KEEPALIVE }));
    // remote_connect_open_args { remote_string name (null); unsigned int flags }
    sock.write(frame({ ...header, prog: PROGRAM.REMOTE, type: TYPE.CALL, serial: 7 }, Buffer.alloc(8)));
    await until(() => answers.length >= 2, 5_000);
    const [pong, open] = answers.map((a) => a.header);
    assert.deepEqual(
      [pong.prog, pong.proc, pong.type, pong.status],
      [PROGRAM.KEEPALIVE, KEEPALIVE_PROC.PONG, TYPE.MESSAGE, STATUS.OK],
    );
    assert.deepEqual(
      [open.prog, open.proc, open.type, open.serial, open.status],
      [PROGRAM.REMOTE, 1, TYPE.REPLY, 7, STATUS.OK],
    );
  } finally {
    sock.destroy();
    await fake.close();
  }
});
