// One open-loop load in a worker thread of its own, so a flood's client
// does not share an event loop with the load whose latency is measured.
import { parentPort, workerData } from 'node:worker_threads';
import { load } from './imds-load.ts';

const w = workerData as {
  name: string;
  origin: string;
  paths: string[];
  seconds: number;
  rate: number;
  headers: Record<string, string>;
  maxInFlight?: number;
};
// Loaded and compiled before the clock starts: the measured load beside it
// must not pay for this thread's start.
parentPort!.postMessage('ready');
await new Promise((go) => parentPort!.once('message', go));
const r = await load(w.name, w.origin, w.paths, w.seconds, w.rate, undefined, w.headers, w.maxInFlight);
parentPort!.postMessage(r);
