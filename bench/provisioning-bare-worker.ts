// The reference for bench/provisioning-events.ts: a bare node:http server in
// a worker thread, as the datasource's is, that answers each GET with a
// fixed small body and each POST with 200 once its body is read, doing
// nothing else. Seed fetches beside the same events to this server show
// what the events cost on this machine whatever the server does with them.
import { createServer } from 'node:http';
import { parentPort } from 'node:worker_threads';

const BODY = Buffer.from('instance-id: iid-0\nlocal-hostname: vm-0\n');
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
let elu = performance.eventLoopUtilization();
let cpu = process.threadCpuUsage();
parentPort!.on('message', (m: string) => {
  if (m !== 'collect') return;
  const busy = performance.eventLoopUtilization(elu);
  elu = performance.eventLoopUtilization();
  const used = process.threadCpuUsage(cpu);
  cpu = process.threadCpuUsage();
  const cpuMs = (used.user + used.system) / 1000;
  parentPort!.postMessage({ eventAt: {}, statusAt: {}, accepted, refused: 0, busyMs: busy.active, cpuMs });
});
const address = server.address();
parentPort!.postMessage({ port: typeof address === 'object' && address ? address.port : 0 });
