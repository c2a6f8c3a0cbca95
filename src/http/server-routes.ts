// The paths of the agent's HTTP listener and what each answers. Probes and
// /metrics belong to the probe listener, the status pages to the status
// listener; a listener serving only one kind says where the other lives.
import type pino from 'pino';
import type { StatusSource } from '../status/snapshot.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { EventLoopMonitor } from './health.ts';
import { html, json, text, type Reply } from './reply.ts';
import { safeErrorForLog } from './safe-error.ts';
import { parseQuery } from './status-filter.ts';
import { parseStateFilter, renderNotFoundPage, renderStatusPage, renderVmiPage, statusJson } from './status-page.ts';

export interface RouteContext {
  serve: 'all' | 'probes' | 'status';
  metrics: Metrics;
  status: StatusSource;
  monitor: EventLoopMonitor;
  log: pino.Logger;
  now: () => Date;
  refreshSeconds: number;
  readinessTimeoutMs: number;
}

interface Route {
  listener: 'probes' | 'status';
  handle(url: URL): Reply | Promise<Reply>;
}

const VMI_PATH = /^\/status\/([^/]+)\/([^/]+)\/?$/;

export function createRouter(ctx: RouteContext): (url: URL) => Promise<Reply> {
  const routes = routeTable(ctx);
  const probes = ctx.serve !== 'status';
  const detail = ctx.serve !== 'probes';
  return async (url) => {
    const path = url.pathname;
    const route = routes.get(path);
    if (route?.listener === 'probes') return probes ? route.handle(url) : notOnStatusListener(path);
    if (!detail) return notOnProbeListener();
    if (route !== undefined) return route.handle(url);
    const m = VMI_PATH.exec(path);
    if (m) return vmiPage(ctx, m[1], m[2]);
    return html(404, renderNotFoundPage(`no page at ${path}`));
  };
}

function routeTable(ctx: RouteContext): Map<string, Route> {
  const statusPageRoute: Route = { listener: 'status', handle: (url) => statusPage(ctx, url) };
  return new Map<string, Route>([
    ['/metrics', { listener: 'probes', handle: () => metricsPage(ctx.metrics) }],
    ['/healthz', { listener: 'probes', handle: () => healthz(ctx.monitor) }],
    ['/readyz', { listener: 'probes', handle: () => readyz(ctx) }],
    ['/status', statusPageRoute],
    ['/status/', statusPageRoute],
    ['/status.json', { listener: 'status', handle: (url) => statusJsonPage(ctx, url) }],
    ['/', { listener: 'status', handle: () => toStatus() }],
  ]);
}

function notOnStatusListener(path: string): Reply {
  return html(
    404,
    renderNotFoundPage(`no page at ${path} on the status listener; probes and /metrics are on --listen`),
  );
}

function notOnProbeListener(): Reply {
  return text(
    404,
    'not served here: this listener has /healthz, /readyz and /metrics; the status pages are on --status-listen (loopback: use kubectl port-forward)\n',
  );
}

async function metricsPage(metrics: Metrics): Promise<Reply> {
  return { status: 200, type: metrics.registry.contentType, body: await metrics.registry.metrics() };
}

function healthz(monitor: EventLoopMonitor): Reply {
  const r = monitor.report();
  return r.healthy
    ? text(200, `ok\nlast heartbeat ${r.lastBeatAgoMs} ms ago, max event loop lag ${r.maxLagMs} ms\n`)
    : text(503, `unhealthy\n${r.reasons.map((x) => `- ${x}\n`).join('')}`);
}

async function readyz(ctx: RouteContext): Promise<Reply> {
  let r: { ready: boolean; reasons: string[]; degraded?: string[] };
  try {
    r = await withTimeout(ctx.status.readiness(), ctx.readinessTimeoutMs);
  } catch (e) {
    ctx.log.warn({ err: safeErrorForLog(e) }, 'readiness check failed');
    return text(503, 'not ready\n- readiness check failed; see the agent log\n');
  }
  const lines = (reasons: string[]) => reasons.map((x) => `- ${String(x).replace(/[\r\n]+/g, ' ')}\n`).join('');
  if (r.ready) return text(200, r.degraded?.length ? `ok (degraded)\n${lines(r.degraded)}` : 'ok\n');
  return text(503, `not ready\n${lines(r.reasons.length ? r.reasons : ['no reason given'])}`);
}

// The list pages show why the agent is not ready: check now, so the page is
// as fresh as /readyz (the result lands in the snapshot).
async function refreshReadiness(ctx: RouteContext): Promise<void> {
  await withTimeout(ctx.status.readiness(), ctx.readinessTimeoutMs).catch((e: unknown) =>
    ctx.log.warn({ err: safeErrorForLog(e) }, 'readiness check failed'),
  );
}

async function statusPage(ctx: RouteContext, url: URL): Promise<Reply> {
  const filter = parseStateFilter(url.searchParams.get('state'));
  const query = parseQuery(url.searchParams.get('q'));
  await refreshReadiness(ctx);
  const probeLinks = ctx.serve !== 'status';
  return html(
    200,
    renderStatusPage(ctx.status.snapshot(), {
      now: ctx.now(),
      filter,
      query,
      clientFilter: true,
      refreshSeconds: ctx.refreshSeconds,
      probeLinks,
    }),
  );
}

async function statusJsonPage(ctx: RouteContext, url: URL): Promise<Reply> {
  const filter = parseStateFilter(url.searchParams.get('state'));
  await refreshReadiness(ctx);
  return json(200, statusJson(ctx.status.snapshot(), filter, ctx.now()));
}

function toStatus(): Reply {
  return { status: 302, type: 'text/plain; charset=utf-8', body: 'see /status\n', headers: { location: '/status' } };
}

function vmiPage(ctx: RouteContext, rawNamespace: string, rawName: string): Reply {
  let ns: string, name: string;
  try {
    ns = decodeURIComponent(rawNamespace);
    name = decodeURIComponent(rawName);
  } catch {
    return html(400, renderNotFoundPage('malformed VMI name in the URL'));
  }
  const snap = ctx.status.snapshot();
  const rec = snap.vmis.find((v) => v.namespace === ns && v.name === name);
  if (!rec) return html(404, renderNotFoundPage(`no VMI ${ns}/${name} on this node`));
  return html(200, renderVmiPage(snap, rec, { now: ctx.now(), refreshSeconds: ctx.refreshSeconds }));
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}
