// Kubeconfigs as kubectl reads them, through client-node's KubeConfig and
// this project's undici pool: exec credential plugins (a token fetched,
// cached until its expirationTimestamp, fetched again after it and after a
// 401), KUBECONFIG=a:b merged, a context other than the current one,
// proxy-url through an HTTP CONNECT proxy, an OIDC id-token, and the
// CONFIG_INVALID a bad kubeconfig gives. The API server is a small HTTPS
// server that records the bearer token of every request.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer as createHttpServer } from 'node:http';
import { createServer, type Server } from 'node:https';
import { connect, type AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { chmod, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { loadConnection, type KubeConnection } from '../../src/kube/connection.ts';
import { KubeConnectionApi } from '../../src/kube/api-client.ts';
import { VmseedError } from '../../src/errors.ts';
import { tempDir } from '../support/agent-harness.ts';
import { testPki, type TestPki } from '../support/test-pki.ts';

interface Api {
  url: string;
  pki: TestPki;
  // Bearer tokens in the order requests brought them ('' for none).
  tokens: string[];
  // Only these are accepted (all when empty); others get 401.
  accept: Set<string>;
  close(): Promise<void>;
}

async function apiServer(t: { after(fn: () => unknown): void }): Promise<Api> {
  const pki = await testPki('vmseed-kubeconfig');
  const tokens: string[] = [];
  const accept = new Set<string>();
  const sockets = new Set<Duplex>();
  const server: Server = createServer({ cert: pki.serverCert, key: pki.serverKey }, (req, res) => {
    const token = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
    tokens.push(token);
    const ok = accept.size === 0 || accept.has(token);
    res.writeHead(ok ? 200 : 401, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kind: 'Status', status: ok ? 'Success' : 'Failure', code: ok ? 200 : 401 }));
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const api: Api = {
    url: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
    pki,
    tokens,
    accept,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
  t.after(() => api.close());
  return api;
}

function kubeconfig(doc: Record<string, unknown>): string {
  return JSON.stringify({ apiVersion: 'v1', kind: 'Config', ...doc });
}

const b64 = (s: string) => Buffer.from(s).toString('base64');

async function get(conn: KubeConnection): Promise<number> {
  const api = new KubeConnectionApi(conn, { retry: { retries: 0 } });
  return (await api.request('GET', '/api/v1/namespaces/default/secrets/x')).status;
}

async function open(
  t: { after(fn: () => unknown): void },
  path: string,
  options: { context?: string } = {},
): Promise<KubeConnection> {
  const conn = await loadConnection(path, options);
  t.after(() => conn.close(100));
  return conn;
}

// An exec credential plugin (client.authentication.k8s.io/v1): each run
// hands out the next token, tok-1, tok-2, ..., valid for $TTL seconds
// (none: no expirationTimestamp); the runs are counted in `<script>.runs`.
async function execPlugin(dir: string): Promise<string> {
  const script = join(dir, 'plugin.sh');
  await writeFile(
    script,
    `#!/bin/sh
n=$(( $(cat "$0.runs" 2>/dev/null || echo 0) + 1 ))
echo $n > "$0.runs"
exp=""
if [ -n "$TTL" ]; then
  exp=$(date -u -d "@$(( $(date +%s) + TTL ))" +%Y-%m-%dT%H:%M:%SZ)
  exp=",\\"expirationTimestamp\\":\\"$exp\\""
fi
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"tok-%s"%s}}' "$n" "$exp"
`,
  );
  await chmod(script, 0o755);
  return script;
}

function execConfig(api: Api, command: string, env: Array<{ name: string; value: string }> = []): string {
  return kubeconfig({
    clusters: [{ name: 'c', cluster: { server: api.url, 'certificate-authority-data': b64(api.pki.caCert) } }],
    users: [
      {
        name: 'u',
        user: {
          exec: { apiVersion: 'client.authentication.k8s.io/v1', command, env, interactiveMode: 'Never' },
        },
      },
    ],
    contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
    'current-context': 'x',
  });
}

test('exec plugin: its token is used until it expires, then the plugin is run again', async (t) => {
  const api = await apiServer(t);
  const dir = await tempDir();
  t.after(() => dir.remove());
  const plugin = await execPlugin(dir.path);
  const path = join(dir.path, 'config');
  // A command with a separator is relative to the kubeconfig, as kubectl has it.
  await writeFile(path, execConfig(api, './plugin.sh', [{ name: 'TTL', value: '2' }]));
  const conn = await open(t, path);
  assert.deepEqual(conn.authHeaders(), {}, 'the fetched token is set by the dispatcher, not here');

  assert.equal(await get(conn), 200);
  assert.equal(await get(conn), 200);
  assert.deepEqual(api.tokens, ['tok-1', 'tok-1'], 'cached while it is valid');
  // The expirationTimestamp has whole seconds: past it within 3 s.
  await new Promise((r) => setTimeout(r, 3100));
  assert.equal(await get(conn), 200);
  assert.deepEqual(api.tokens, ['tok-1', 'tok-1', 'tok-2'], 'the expired token replaced by a new run');
  assert.equal((await readFile(`${plugin}.runs`, 'utf8')).trim(), '2');
});

test('exec plugin: a 401 runs it again and the call is retried once with the new token', async (t) => {
  const api = await apiServer(t);
  const dir = await tempDir();
  t.after(() => dir.remove());
  const plugin = await execPlugin(dir.path);
  const path = join(dir.path, 'config');
  await writeFile(path, execConfig(api, plugin));
  const conn = await open(t, path);
  api.accept.add('tok-2'); // tok-1, which has no expiry, was revoked
  const apiClient = new KubeConnectionApi(conn, { retry: { retries: 0 } });
  const res = await apiClient.request('GET', '/api/v1/namespaces/default/secrets/x');
  assert.equal(res.status, 200);
  assert.deepEqual(api.tokens, ['tok-1', 'tok-2']);
  // Concurrent requests share one run, and a second 401 soon after does
  // not run the plugin again (an API server refusing every token).
  api.accept.clear();
  api.accept.add('never');
  const statuses = await Promise.all([1, 2, 3].map(() => get(conn)));
  assert.deepEqual(statuses, [401, 401, 401]);
  assert.equal((await readFile(`${plugin}.runs`, 'utf8')).trim(), '2');
});

test('exec plugin that fails: the request fails with its message, nothing else', async (t) => {
  const api = await apiServer(t);
  const dir = await tempDir();
  t.after(() => dir.remove());
  const script = join(dir.path, 'broken.sh');
  await writeFile(script, '#!/bin/sh\necho "login expired: run sso-login" >&2\nexit 1\n');
  await chmod(script, 0o755);
  const path = join(dir.path, 'config');
  await writeFile(path, execConfig(api, script));
  const conn = await open(t, path);
  await assert.rejects(get(conn), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'KUBE_API_UNAVAILABLE');
    assert.match(e.message, /exec plugin failed: login expired/);
    return true;
  });
  assert.deepEqual(api.tokens, [], 'no request left without a credential');
});

test('KUBECONFIG=a:b: context and cluster in a, user in b, first file wins on a name', async (t) => {
  const api = await apiServer(t);
  const dir = await tempDir();
  t.after(() => dir.remove());
  const a = join(dir.path, 'a');
  const b = join(dir.path, 'b');
  await writeFile(
    a,
    kubeconfig({
      clusters: [{ name: 'c', cluster: { server: api.url, 'certificate-authority-data': b64(api.pki.caCert) } }],
      contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
      'current-context': 'x',
    }),
  );
  await writeFile(join(dir.path, 'b-token'), 'from-b\n');
  await writeFile(
    b,
    kubeconfig({
      // kubectl keeps a's cluster 'c'; client-node alone would refuse the duplicate.
      clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:1' } }],
      users: [{ name: 'u', user: { tokenFile: 'b-token' } }],
      contexts: [{ name: 'y', context: { cluster: 'c', user: 'u' } }],
      'current-context': 'y',
    }),
  );
  const conn = await open(t, [a, join(dir.path, 'absent'), b].join(':'));
  assert.equal(conn.getCurrentCluster().server, api.url);
  assert.equal(await get(conn), 200);
  assert.deepEqual(api.tokens, ['from-b'], "b's token file, relative to b");
});

test('a context other than the current one; an unknown one is CONFIG_INVALID naming context', async (t) => {
  const api = await apiServer(t);
  const dir = await tempDir();
  t.after(() => dir.remove());
  const path = join(dir.path, 'config');
  await writeFile(
    path,
    kubeconfig({
      clusters: [
        { name: 'dead', cluster: { server: 'https://127.0.0.1:1' } },
        { name: 'live', cluster: { server: api.url, 'certificate-authority-data': b64(api.pki.caCert) } },
      ],
      users: [
        { name: 'one', user: { token: 'one' } },
        { name: 'two', user: { token: 'two' } },
      ],
      contexts: [
        { name: 'current', context: { cluster: 'dead', user: 'one' } },
        { name: 'other', context: { cluster: 'live', user: 'two' } },
      ],
      'current-context': 'current',
    }),
  );
  const conn = await open(t, path, { context: 'other' });
  assert.equal(await get(conn), 200);
  assert.deepEqual(api.tokens, ['two']);
  await assert.rejects(loadConnection(path, { context: 'nope' }), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'CONFIG_INVALID');
    assert.equal(e.field, 'context');
    assert.match(e.message, /context 'nope' is not in .*; it has current, other/);
    return true;
  });
});

test('proxy-url: requests go through the HTTP proxy, in a CONNECT tunnel', async (t) => {
  const api = await apiServer(t);
  const connects: string[] = [];
  const tunnels = new Set<Duplex>();
  const proxy = createHttpServer((_req, res) => res.writeHead(405).end());
  proxy.on('connect', (req, client: Duplex, head: Buffer) => {
    connects.push(req.url ?? '');
    const [host, port] = (req.url ?? '').split(':');
    const upstream = connect(Number(port), host, () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      upstream.write(head);
      upstream.pipe(client);
      client.pipe(upstream);
    });
    for (const s of [client, upstream]) {
      tunnels.add(s);
      s.on('error', () => s.destroy());
      s.on('close', () => tunnels.delete(s));
    }
  });
  await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
  t.after(async () => {
    for (const s of tunnels) s.destroy();
    await new Promise((r) => proxy.close(r));
  });
  const dir = await tempDir();
  t.after(() => dir.remove());
  const path = join(dir.path, 'config');
  await writeFile(
    path,
    kubeconfig({
      clusters: [
        {
          name: 'c',
          cluster: {
            server: api.url,
            'certificate-authority-data': b64(api.pki.caCert),
            'proxy-url': `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`,
          },
        },
      ],
      users: [{ name: 'u', user: { token: 'via-proxy' } }],
      contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
      'current-context': 'x',
    }),
  );
  const conn = await open(t, path);
  assert.equal(await get(conn), 200);
  assert.deepEqual(connects, [new URL(api.url).host]);
  assert.deepEqual(api.tokens, ['via-proxy']);
});

test('OIDC auth-provider: its id-token is sent as the bearer token', async (t) => {
  const api = await apiServer(t);
  const dir = await tempDir();
  t.after(() => dir.remove());
  const part = (o: unknown) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const idToken = `${part({ alg: 'RS256', typ: 'JWT' })}.${part({ iss: 'https://issuer.invalid', sub: 'ops', exp: Math.floor(Date.now() / 1000) + 3600 })}.c2ln`;
  const path = join(dir.path, 'config');
  await writeFile(
    path,
    kubeconfig({
      clusters: [{ name: 'c', cluster: { server: api.url, 'certificate-authority-data': b64(api.pki.caCert) } }],
      users: [
        {
          name: 'u',
          user: {
            'auth-provider': {
              name: 'oidc',
              config: { 'client-id': 'vmseed', 'idp-issuer-url': 'https://issuer.invalid', 'id-token': idToken },
            },
          },
        },
      ],
      contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
      'current-context': 'x',
    }),
  );
  const conn = await open(t, path);
  assert.equal(await get(conn), 200);
  assert.deepEqual(api.tokens, [idToken]);
  assert.equal(conn.tokenRejected(), false, 'a refused id-token is not worth a retry');
});

test('a bad kubeconfig is CONFIG_INVALID naming the kubeconfig and what is wrong', async (t) => {
  const dir = await tempDir();
  t.after(() => dir.remove());
  const cases: Array<[string, string, RegExp]> = [
    ['not-yaml', 'clusters: [\n', /not YAML/],
    ['no-server', kubeconfig({ clusters: [{ name: 'c', cluster: {} }] }), /clusters\[0\]\.cluster\.server is missing/],
    ['no-context', kubeconfig({ clusters: [] }), /no current-context/],
    [
      'no-cluster',
      kubeconfig({ contexts: [{ name: 'x', context: { cluster: 'gone', user: 'u' } }], 'current-context': 'x' }),
      /names cluster 'gone', which is not there/,
    ],
    [
      'ca-missing',
      kubeconfig({
        clusters: [{ name: 'c', cluster: { server: 'https://h:6443', 'certificate-authority': 'missing.crt' } }],
        contexts: [{ name: 'x', context: { cluster: 'c' } }],
        'current-context': 'x',
      }),
      /cannot read a referenced file \(ENOENT\)/,
    ],
    [
      'bad-proxy',
      kubeconfig({
        clusters: [{ name: 'c', cluster: { server: 'https://h:6443', 'proxy-url': 'ftp://p' } }],
        contexts: [{ name: 'x', context: { cluster: 'c' } }],
        'current-context': 'x',
      }),
      /proxy-url is not an http, https or socks5 URL/,
    ],
    [
      'exec-missing',
      kubeconfig({
        clusters: [{ name: 'c', cluster: { server: 'https://h:6443' } }],
        users: [
          {
            name: 'u',
            user: {
              exec: {
                apiVersion: 'client.authentication.k8s.io/v1',
                command: 'vmseed-no-such-plugin',
                installHint: 'install it with: get-plugin',
              },
            },
          },
        ],
        contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'x',
      }),
      /exec plugin command 'vmseed-no-such-plugin' is not found \(not in PATH\).*: install it with: get-plugin/,
    ],
    [
      'secret-in-file',
      kubeconfig({
        clusters: [{ name: 'c', cluster: { server: 'ftp://h' } }],
        users: [{ name: 'u', user: { token: 'do-not-print-me' } }],
        contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'x',
      }),
      /server 'ftp:\/\/h' is not an http\(s\) URL/,
    ],
  ];
  for (const [name, text, why] of cases) {
    const path = join(dir.path, name);
    await writeFile(path, text);
    await assert.rejects(loadConnection(path), (e: unknown) => {
      assert.ok(e instanceof VmseedError, name);
      assert.equal(e.code, 'CONFIG_INVALID', name);
      assert.equal(e.field, 'kubeconfig', name);
      assert.match(e.message, why, name);
      assert.doesNotMatch(e.message, /do-not-print-me/, name);
      return true;
    });
  }
  // Sizes are checked before a file is read: a kubeconfig over 4 MiB, a
  // device, a PEM file over 1 MiB.
  const big = join(dir.path, 'big');
  await writeFile(big, `# ${'x'.repeat(4 * 1024 * 1024)}\n`);
  await assert.rejects(loadConnection(big), /big: \d+ bytes, more than the 4194304 a kubeconfig file may have/);
  await assert.rejects(loadConnection('/dev/zero'), /\/dev\/zero: not a regular file/);
  const bigPem = join(dir.path, 'big.crt');
  await writeFile(bigPem, 'x'.repeat(1024 * 1024 + 1));
  const withBigCa = join(dir.path, 'big-ca');
  await writeFile(
    withBigCa,
    kubeconfig({
      clusters: [{ name: 'c', cluster: { server: 'https://h:6443', 'certificate-authority': bigPem } }],
      contexts: [{ name: 'x', context: { cluster: 'c' } }],
      'current-context': 'x',
    }),
  );
  await assert.rejects(loadConnection(withBigCa), /big\.crt: 1048577 bytes, more than the 1048576/);
  await assert.rejects(loadConnection(join(dir.path, 'absent')), /cannot read .*absent: ENOENT/);
  await assert.rejects(
    loadConnection([join(dir.path, 'absent'), join(dir.path, 'absent2')].join(':')),
    /none of .* exists/,
  );
});
