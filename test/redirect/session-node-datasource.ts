// Child process for the session hop-limit network-namespace test: the
// datasource listener with --datasource-imds-session required and
// source-address identity, one IMDS VMI at the "launcher pod" address
// (`ip netns exec NS node session-node-datasource.ts HOST PORT POD_ADDRESS`).
// Prints `ready <port>`; stops on SIGTERM.
import pino from 'pino';
import { startDatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { MapDirectory, nocloudSeed, randomKey } from '../datasource/datasource-fixtures.ts';
import { entry, facts } from '../datasource/imds-support.ts';

const [host, port, podAddress] = process.argv.slice(2);
const dir = new MapDirectory();
dir.add(entry('vm', nocloudSeed('vm', { delivery: 'http' }), facts({ serviceAccountName: 'sa-vm' })), [podAddress]);
const server = await startDatasourceServer({
  listen: { host, port: Number(port) },
  directory: dir,
  keyring: new DatasourceKeyring([randomKey()]),
  logger: pino({ level: 'silent' }),
  compatSourceAddress: true,
  imdsSessions: { mode: 'required' },
});
process.stdout.write(`ready ${server.address.port}\n`);
process.on('SIGTERM', () => {
  void server.close().then(() => process.exit(0));
});
