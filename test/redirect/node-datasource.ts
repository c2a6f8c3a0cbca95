// Child process for the network-namespace tests: the agent's NoCloud
// datasource listener over one seed, started inside the test's "node"
// namespace (`ip netns exec NS node node-datasource.ts HOST PORT KEY UID`).
// Prints `ready <port>` once listening; stops on SIGTERM.
import pino from 'pino';
import { startDatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { MapDirectory, nocloudSeed } from '../datasource/datasource-fixtures.ts';

// `bench N`: also uid-0 … uid-(N-1), and no per-source rate limit (one
// load generator stands for every guest), for bench:imds --redirect.
const [host, port, key, uid, limits, count] = process.argv.slice(2);
const dir = new MapDirectory();
dir.add({ namespace: 'ns', name: 'vm', uid: uid, seed: nocloudSeed('vm') });
if (limits === 'bench')
  for (let i = 0; i < Number(count ?? 0); i++)
    dir.add({ namespace: 'bench', name: `vm-${i}`, uid: `uid-${i}`, seed: nocloudSeed(String(i)) });
const server = await startDatasourceServer({
  listen: { host: host, port: Number(port) },
  directory: dir,
  keyring: new DatasourceKeyring([new Uint8Array(Buffer.from(key, 'base64'))]),
  logger: pino({ level: 'silent' }),
  ...(limits === 'bench' ? { limits: { ratePerSecond: 1e9, burst: 1e9 } } : {}),
});
process.stdout.write(`ready ${server.address.port}\n`);
process.on('SIGTERM', () => {
  void server.close().then(() => process.exit(0));
});
