// Child process for the IMDS network-namespace test: the datasource
// listener with source-address identity, one IMDS VMI reporting the
// "launcher pod" address, tokens read from a pods tree
// (`ip netns exec NS node imds-node-datasource.ts HOST PORT POD_ADDRESS PODS_DIR POD_UID`).
// Prints `ready <port>`; stops on SIGTERM.
import pino from 'pino';
import { startDatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { launcherTokenReader } from '../../src/agent/domain/launcher-token.ts';
import { MapDirectory, nocloudSeed, randomKey } from '../datasource/datasource-fixtures.ts';
import { entry, facts } from '../datasource/imds-support.ts';

const [host, port, podAddress, podsDir, podUid] = process.argv.slice(2);
const dir = new MapDirectory();
const imds = facts({ serviceAccountName: 'sa-vm', serviceAccountToken: true, launcherPods: [podUid] });
dir.add(entry('vm', nocloudSeed('vm', { delivery: 'http', networkConfig: undefined }), imds), [podAddress]);
const server = await startDatasourceServer({
  listen: { host, port: Number(port) },
  directory: dir,
  keyring: new DatasourceKeyring([randomKey()]),
  logger: pino({ level: 'silent' }),
  compatSourceAddress: true,
  readServiceAccountToken: launcherTokenReader(podsDir),
});
process.stdout.write(`ready ${server.address.port}\n`);
process.on('SIGTERM', () => {
  void server.close().then(() => process.exit(0));
});
