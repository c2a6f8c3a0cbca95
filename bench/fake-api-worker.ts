// The fake API server of bench:webhook on a thread of its own, so that what
// the bench measures of the webhook is not the fake's work on the same event
// loop (an API server runs elsewhere): it holds the Secrets it is given and
// answers with the token it is told to accept.
import { parentPort, workerData } from 'node:worker_threads';
import type { SecretObject } from '../src/api/objects.ts';
import { FakeKube } from '../test/support/fake-kube.ts';

const { secrets, token } = workerData as { secrets: SecretObject[]; token: string };
const fake = await FakeKube.start({ adminTokens: [token] });
for (const secret of secrets) fake.setSecret(secret);
parentPort!.postMessage({ url: fake.url, ca: fake.caCert });
parentPort!.once('message', () => {
  void fake.close().then(() => process.exit(0));
});
