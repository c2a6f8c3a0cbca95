import { test } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { parseListen, startHttpServer, MAX_URL_LENGTH } from '../../src/http/status-server.ts';
import { CONTENT_SECURITY_POLICY } from '../../src/http/status-page.ts';
import { FakeStatusSource } from '../support/fake-status.ts';
import { captureLogger } from '../support/capture-logger.ts';

// When `url` first answers 200 (performance.now()), polling until `budgetMs`.
async function waitFor200(url: string, budgetMs: number): Promise<number> {
  const end = performance.now() + budgetMs;
  while (performance.now() < end) {
    if ((await fetch(url)).status === 200) return performance.now();
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(`${url} not 200 within ${budgetMs} ms`);
}

async function withServer(
  fn: (ctx: { url: string; source: FakeStatusSource; lines: string[] }) => Promise<void>,
  extra: Partial<Parameters<typeof startHttpServer>[0]> = {},
) {
  const source = new FakeStatusSource();
  const { logger, lines } = captureLogger();
  const srv = await startHttpServer({
    listen: '127.0.0.1:0',
    metrics: createMetrics({ version: 't', processMetrics: false }),
    status: source,
    logger,
    ...extra,
  });
  try {
    await fn({ url: srv.url, source, lines });
  } finally {
    await srv.close();
  }
}

// fetch() refuses some methods (TRACE, CONNECT) and normalises URLs; a raw
// request shows what the server really does.
function raw(
  url: string,
  method: string,
  path: string,
): Promise<{ status: number; headers: Record<string, unknown>; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(new URL(url), { method, path }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

test('parseListen', () => {
  assert.deepEqual(parseListen('127.0.0.1:8080'), { host: '127.0.0.1', port: 8080 });
  assert.deepEqual(parseListen('[::1]:0'), { host: '::1', port: 0 });
  assert.deepEqual(parseListen(':9000'), { host: '0.0.0.0', port: 9000 });
  assert.deepEqual(parseListen('localhost:1'), { host: 'localhost', port: 1 });
  for (const bad of ['8080', 'host:', 'a:b', '1.2.3.4:70000', '::1:80']) {
    assert.throws(
      () => parseListen(bad),
      (e: any) => e.code === 'CONFIG_INVALID' && e.field === 'listen',
      bad,
    );
  }
});

test('port 0 picks a port; url and address agree; close() ends keep-alive connections', async () => {
  const { logger } = captureLogger();
  const srv = await startHttpServer({
    listen: '127.0.0.1:0',
    metrics: createMetrics({ version: 't', processMetrics: false }),
    status: new FakeStatusSource(),
    logger,
  });
  assert.equal(srv.address.host, '127.0.0.1');
  assert.ok(srv.address.port > 0);
  assert.equal(srv.url, `http://127.0.0.1:${srv.address.port}`);
  assert.equal((await fetch(`${srv.url}/healthz`)).status, 200);
  const t0 = performance.now();
  await srv.close();
  await srv.close();
  assert.ok(performance.now() - t0 < 5000);
  await assert.rejects(fetch(`${srv.url}/healthz`), (e: any) => e.cause?.code === 'ECONNREFUSED');
});

test('listening on a busy port fails with CONFIG_INVALID', async () => {
  await withServer(async ({ url }) => {
    const { logger } = captureLogger();
    await assert.rejects(
      startHttpServer({
        listen: `127.0.0.1:${new URL(url).port}`,
        metrics: createMetrics({ version: 't', processMetrics: false }),
        status: new FakeStatusSource(),
        logger,
      }),
      (e: any) => e.code === 'CONFIG_INVALID' && /EADDRINUSE/.test(e.message),
    );
  });
});

test('routes answer with the right status and content type, and security headers everywhere', async () => {
  await withServer(async ({ url }) => {
    const cases: Array<[string, number, RegExp]> = [
      ['/metrics', 200, /^text\/plain; version=0\.0\.4/],
      ['/healthz', 200, /^text\/plain/],
      ['/readyz', 200, /^text\/plain/],
      ['/status', 200, /^text\/html; charset=utf-8$/],
      ['/status?state=error', 200, /^text\/html/],
      ['/status.json', 200, /^application\/json/],
      ['/status/default/web-1', 200, /^text\/html/],
      ['/status/default/nope', 404, /^text\/html/],
      ['/status/%E0%A4%A/x', 400, /^text\/html/],
      ['/nope', 404, /^text\/html/],
    ];
    for (const [path, status, type] of cases) {
      const res = await fetch(url + path, { redirect: 'manual' });
      await res.arrayBuffer();
      assert.equal(res.status, status, path);
      assert.match(res.headers.get('content-type') ?? '', type, path);
      assert.equal(res.headers.get('content-security-policy'), CONTENT_SECURITY_POLICY, path);
      assert.equal(res.headers.get('x-content-type-options'), 'nosniff', path);
      assert.equal(res.headers.get('x-frame-options'), 'DENY', path);
      assert.equal(res.headers.get('cache-control'), 'no-store', path);
    }
    const root = await fetch(url + '/', { redirect: 'manual' });
    assert.equal(root.status, 302);
    assert.equal(root.headers.get('location'), '/status');
  });
});

test('status.json carries the snapshot and honours ?state', async () => {
  await withServer(async ({ url, source }) => {
    const all: any = await (await fetch(url + '/status.json')).json();
    assert.equal(all.nodeName, 'node-a');
    assert.equal(all.vmis.length, source.current.vmis.length);
    assert.deepEqual(all.counts, { error: 1, warning: 1, pending: 1, ready: 1, skipped: 1 });
    const err: any = await (await fetch(url + '/status.json?state=error')).json();
    assert.deepEqual(
      err.vmis.map((v: any) => v.name),
      ['db-0'],
    );
    assert.equal(err.vmis[0].lastError.code, 'SECRET_NOT_FOUND');
    const bogus: any = await (await fetch(url + '/status.json?state=<x>')).json();
    assert.equal(bogus.filter, null);
  });
});

test('the detail page decodes namespace and name', async () => {
  await withServer(async ({ url, source }) => {
    source.current.vmis.push({
      namespace: 'ns x',
      name: 'ä/b',
      uid: 'u',
      state: 'ready',
      warnings: [],
      retries: 0,
      files: [{ path: 'user-data', size: 12 }],
    });
    const res = await fetch(`${url}/status/${encodeURIComponent('ns x')}/${encodeURIComponent('ä/b')}`);
    assert.equal(res.status, 200);
    const body = await res.text();
    assert.ok(body.includes('ä/b'));
    assert.ok(body.includes('>user-data</td>'));
  });
});

test('HEAD: same status and headers, no body', async () => {
  await withServer(async ({ url }) => {
    for (const path of ['/status', '/metrics', '/nope']) {
      const get = await fetch(url + path);
      const getBody = await get.text();
      const head = await raw(url, 'HEAD', path);
      assert.equal(head.status, get.status, path);
      assert.equal(head.body, '', path);
      assert.equal(head.headers['content-type'], get.headers.get('content-type'));
      // Status pages re-render per request (render time), so compare length only for /nope.
      if (path === '/nope') assert.equal(Number(head.headers['content-length']), Buffer.byteLength(getBody));
    }
  });
});

test('other methods: 405 with Allow', async () => {
  await withServer(async ({ url }) => {
    for (const method of ['POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'TRACE']) {
      const r = await raw(url, method, '/status');
      assert.equal(r.status, 405, method);
      assert.equal(r.headers['allow'], 'GET, HEAD');
    }
  });
});

test('URL length is bounded', async () => {
  await withServer(async ({ url }) => {
    const long = await fetch(`${url}/status?state=${'a'.repeat(MAX_URL_LENGTH)}`);
    assert.equal(long.status, 414);
    const ok = await fetch(`${url}/status?state=${'a'.repeat(MAX_URL_LENGTH - 30)}`);
    assert.equal(ok.status, 200);
  });
});

test('an exception in the status source: 500 without its message or stack, logged without its message', async () => {
  await withServer(async ({ url, source, lines }) => {
    source.snapshotError = new Error('boom-MARKER-7f3a');
    for (const path of ['/status', '/status.json', '/status/default/web-1']) {
      const res = await fetch(url + path);
      const body = await res.text();
      assert.equal(res.status, 500, path);
      assert.equal(body, 'internal error; see the agent log\n');
    }
    const errors = lines.filter((l) => JSON.parse(l).level === 50);
    assert.equal(errors.length, 3);
    assert.ok(
      errors.every((l) => l.includes('"stack"') && l.includes('server.test.ts')),
      'stack frames are logged',
    );
    assert.ok(!lines.some((l) => l.includes('MARKER')));
  });
});

test('requests are logged at debug level with the path and never the query string', async () => {
  await withServer(async ({ url, lines }) => {
    await (await fetch(`${url}/status?state=error&token=QUERY-SECRET-1234`)).text();
    const reqLines = lines.map((l) => JSON.parse(l)).filter((l) => l.msg === 'http request');
    assert.equal(reqLines.length, 1);
    assert.equal(reqLines[0].level, 20);
    assert.equal(reqLines[0].path, '/status');
    assert.equal(reqLines[0].status, 200);
    assert.equal(reqLines[0].component, 'http');
    assert.ok(!lines.some((l) => l.includes('QUERY-SECRET')));
  });
});

test('/readyz follows the status source: 200, 503 with reasons, 200 again; failures and hangs are 503', async () => {
  await withServer(
    async ({ url, source }) => {
      let res = await fetch(url + '/readyz');
      assert.equal(res.status, 200);
      assert.equal(await res.text(), 'ok\n');

      source.ready = {
        ready: false,
        reasons: ['informer not synced', 'state directory /var/lib/vmseed not writable: EACCES'],
      };
      res = await fetch(url + '/readyz');
      assert.equal(res.status, 503);
      assert.equal(
        await res.text(),
        'not ready\n- informer not synced\n- state directory /var/lib/vmseed not writable: EACCES\n',
      );

      source.ready = { ready: true, reasons: [] };
      res = await fetch(url + '/readyz');
      assert.equal(res.status, 200);

      source.readinessError = new Error('readiness exploded READY-MARKER');
      res = await fetch(url + '/readyz');
      assert.equal(res.status, 503);
      assert.ok(!(await res.text()).includes('READY-MARKER'));
      source.readinessError = undefined;

      const realReadiness = source.readiness.bind(source);
      source.readiness = () => new Promise(() => {});
      const t0 = performance.now();
      res = await fetch(url + '/readyz');
      assert.equal(res.status, 503);
      // The 200 ms readiness timeout answered, not the hung check (generous
      // bound: the machine is shared).
      assert.ok(performance.now() - t0 < 15_000);
      source.readiness = realReadiness;
      assert.equal((await fetch(url + '/readyz')).status, 200);
    },
    { readinessTimeoutMs: 200 },
  );
});

test('/healthz turns 503 after the event loop was blocked, and 200 again when the window has passed', async () => {
  await withServer(
    async ({ url }) => {
      // Healthy first (a loaded machine may have stalled the loop just before).
      await waitFor200(url + '/healthz', 20_000);
      const until = performance.now() + 1200;
      while (performance.now() < until) {
        // block the loop
      }
      await new Promise((r) => setTimeout(r, 50));
      const res = await fetch(url + '/healthz');
      const body = await res.text();
      assert.equal(res.status, 503, body);
      assert.match(body, /event loop blocked for \d+ ms/);
      // 200 again, and not before the window has passed since the block.
      const recovered = await waitFor200(url + '/healthz', 20_000);
      assert.ok(recovered - until >= 4900, `200 again ${recovered - until} ms after the block`);
    },
    // Generous threshold and window: the machine running the tests is
    // shared, and the 503 must still be in the window when it is asked for.
    { health: { intervalMs: 20, thresholdMs: 600, windowMs: 5000 } },
  );
});

test("serve: 'probes' answers /healthz, /readyz, /metrics only; 'status' the per-VMI pages only", async () => {
  const detail = ['/', '/status', '/status/', '/status.json', '/status/default/web-1', '/status?state=ready'];
  const probes = ['/healthz', '/readyz', '/metrics'];
  await withServer(
    async ({ url }) => {
      for (const p of probes) assert.equal((await fetch(`${url}${p}`)).status, 200, `probes: ${p}`);
      for (const p of detail) {
        const res = await fetch(`${url}${p}`, { redirect: 'manual' });
        assert.equal(res.status, 404, `probes: ${p}`);
        const body = await res.text();
        assert.match(body, /--status-listen/, `probes: ${p} says where the pages are`);
        assert.doesNotMatch(body, /web-1/, `probes: ${p} shows no VMI`);
      }
    },
    { serve: 'probes' },
  );
  await withServer(
    async ({ url, source }) => {
      for (const p of ['/status', '/status.json'])
        assert.equal((await fetch(`${url}${p}`)).status, 200, `status: ${p}`);
      assert.equal((await fetch(`${url}/`, { redirect: 'manual' })).status, 302);
      assert.doesNotMatch(
        await (await fetch(`${url}/status`)).text(),
        /href="\/metrics"/,
        'no link to a page this listener does not serve',
      );
      const name = source.snapshot().vmis[0];
      assert.equal((await fetch(`${url}/status/${name.namespace}/${name.name}`)).status, 200);
      for (const p of probes) {
        const res = await fetch(`${url}${p}`);
        assert.equal(res.status, 404, `status: ${p}`);
        assert.match(await res.text(), /--listen/);
      }
    },
    { serve: 'status' },
  );
});

test('one source gets at most 32 connections (silent ones too); probes from another address still answer', async () => {
  const { connect } = await import('node:net');
  await withServer(
    async ({ url }) => {
      const { port } = new URL(url);
      const sockets = await Promise.all(
        Array.from(
          { length: 40 },
          () =>
            new Promise<{ closed: Promise<void> }>((resolve) => {
              const s = connect({ port: Number(port), host: '127.0.0.1', localAddress: '127.0.0.1' });
              const closed = new Promise<void>((r) => s.on('close', () => r()));
              s.on('error', () => {});
              s.on('data', () => {});
              s.on('connect', () => resolve({ closed }));
            }),
        ),
      );
      // The eight over the share are closed by the server at once.
      const done = await Promise.all(
        sockets.map((s) =>
          Promise.race([s.closed.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 2000))]),
        ),
      );
      assert.equal(done.filter(Boolean).length, 8);
      const res = await new Promise<number>((resolve, reject) => {
        request(
          { host: '127.0.0.1', port: Number(port), path: '/healthz', localAddress: '127.0.0.2', agent: false },
          (r) => {
            r.resume();
            resolve(r.statusCode ?? 0);
          },
        )
          .on('error', reject)
          .end();
      });
      assert.equal(res, 200);
    },
    { serve: 'probes' },
  );
});
