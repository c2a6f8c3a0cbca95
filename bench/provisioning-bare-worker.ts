// The reference for bench/provisioning-events.ts: a bare node:http server in
// a worker thread, as the datasource's is, that answers each GET with a
// fixed small body and each POST with 200 once its body is read, doing
// nothing else. Seed fetches beside the same events to this server show
// what the events cost on this machine whatever the server does with them.
import { createServer } from 'node:http';
import { parentPort } from 'node:worker_threads';
import { threadUsage } from './thread-usage.ts';

const BODY = Buffer.from('instance-id: iid-0\nlocal-hostname: vm-0\n');
// Events answered, so far.
let accepted = 0;
const server = createServer((req, res) => {
  if (req.method === 'POST') {
    req.resume();
    req.on('end', () => {
      accepted++;
      res.writeHead(200, { 'Content-Type': 'text/plain' }).end('ok\n');
    });
    return;
  }
  res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': BODY.length }).end(BODY);
});
await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
const usage = threadUsage();
parentPort!.on('message', (m: string) => {
  if (m === 'collect') parentPort!.postMessage({ eventAt: {}, statusAt: {}, accepted, ...usage() });
});
const address = server.address();
parentPort!.postMessage({ port: typeof address === 'object' && address ? address.port : 0 });
