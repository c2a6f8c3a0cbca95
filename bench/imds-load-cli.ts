// bench:imds --redirect runs its load generator inside the test "launcher
// pod" namespace through this entry point: the same open-loop load as the
// loopback rows, against ORIGIN, printed as JSON for the parent.
//   node bench/imds-load-cli.ts NAME ORIGIN KEY_BASE64 VMIS SECONDS RATE
import { signToken } from '../src/datasource/tokens.ts';
import { load } from './imds-load.ts';

const [name, origin, keyB64, vmis, secs, rate] = process.argv.slice(2);
const key = new Uint8Array(Buffer.from(keyB64, 'base64'));
const paths: string[] = [];
for (let i = 0; i < Number(vmis); i++)
  for (const f of ['meta-data', 'user-data', 'vendor-data', 'network-config'])
    paths.push(`/v1/${signToken(key, `uid-${i}`)}/${f}`);
await load('warm-up', origin, paths, 1, Number(rate));
const r = await load(name, origin, paths, Number(secs), Number(rate));
process.stdout.write(JSON.stringify({ ...r, latenciesMs: Array.from(r.latenciesMs) }) + '\n');
