// The node status page: AgentStatusSnapshot in, HTML out. Pure (the render
// time is passed in). Only fields declared in status/snapshot.ts are read: a
// snapshot object that carries anything more (a careless agent, a future
// field) never leaks it, because projectSnapshot() copies field by field.
import { createHash } from 'node:crypto';
import type {
  AgentStatusSnapshot,
  LibvirtConnectionStatus,
  LibvirtStatus,
  RedirectStatus,
  SourceError,
  StatusProblem,
  VmiState,
  VmiStatusRecord,
  WatchStatus,
} from '../status/snapshot.ts';
import { formatAgo, formatBytes, formatSeconds, formatTime } from '../core/format.ts';
import { esc } from './html.ts';
import { FILTER_SCRIPT, FILTER_SCRIPT_HASH, MAX_QUERY_LENGTH, matchesQuery } from './status-filter.ts';
import { defined, num, str } from './projection.ts';

type FirstBoot = NonNullable<VmiStatusRecord['firstBoot']>;
import { renderLatencyChart } from './svg-chart.ts';
import {
  projectProvisioning,
  provisioningCounts,
  provisioningLine,
  provisioningPanel,
  provisioningTimeline,
} from './provisioning-panel.ts';

export const VMI_STATES: readonly VmiState[] = ['error', 'warning', 'pending', 'ready', 'skipped'];

export function parseStateFilter(value: string | null | undefined): VmiState | undefined {
  return VMI_STATES.find((s) => s === value);
}

// ---- projection: the only way data gets from a snapshot to a response ----

function projectProblem(p: StatusProblem): StatusProblem {
  return defined({
    code: p.code,
    message: String(p.message),
    kind: p.kind,
    field: str(p.field),
    schema: p.schema ? projectSchemaInfo(p.schema) : undefined,
    at: String(p.at),
  });
}

// A schema problem's place: names and paths, never a value.
function projectSchemaInfo(s: NonNullable<StatusProblem['schema']>): NonNullable<StatusProblem['schema']> {
  const document = (['user-data', 'vendor-data', 'network-config'] as const).find((d) => d === s.document);
  return defined({
    document: document ?? 'user-data',
    part: str(s.part),
    path: String(s.path),
    module: String(s.module),
    severity: s.severity === 'deprecation' ? ('deprecation' as const) : ('error' as const),
    release: String(s.release),
  });
}

// Who builds the seed of an adopted VMI, and since when it is vmseed's.
function adoptedHtml(a: NonNullable<VmiStatusRecord['adopted']>): string {
  const asked = a.by === 'namespace' ? "its namespace's vmseed.io/adopt label" : 'its vmseed.io/adopt annotation';
  return `KubeVirt volume <span class="mono">${esc(a.volume)}</span> (${esc(a.kind)}), adopted at admission <span class="muted">(${esc(asked)})</span>`;
}

export function projectVmi(v: VmiStatusRecord): VmiStatusRecord {
  const inj = v.injection;
  return defined({
    namespace: String(v.namespace),
    name: String(v.name),
    uid: String(v.uid),
    state: v.state,
    datasource: v.datasource,
    adopted: v.adopted
      ? {
          volume: String(v.adopted.volume),
          kind: v.adopted.kind === 'cloudInitConfigDrive' ? 'cloudInitConfigDrive' : 'cloudInitNoCloud',
          by: v.adopted.by === 'namespace' ? 'namespace' : 'annotation',
        }
      : undefined,
    imagePath: str(v.imagePath),
    imageBytes: num(v.imageBytes),
    contentHash: str(v.contentHash),
    generatedAt: str(v.generatedAt),
    generationSeconds: num(v.generationSeconds),
    files: v.files?.map((f) => ({ path: String(f.path), size: Number(f.size) })),
    injection: inj
      ? {
          domain: String(inj.domain),
          targetDev: String(inj.targetDev),
          bus: inj.bus,
          flags: inj.flags.map(String),
          domainState: inj.domainState,
          seededAfterBoot: Boolean(inj.seededAfterBoot),
          resumed: Boolean(inj.resumed),
          at: String(inj.at),
        }
      : undefined,
    firstBoot: v.firstBoot ? projectFirstBoot(v.firstBoot) : undefined,
    provisioning: v.provisioning ? projectProvisioning(v.provisioning) : undefined,
    lastError: v.lastError ? projectProblem(v.lastError) : undefined,
    warnings: (v.warnings ?? []).map(projectProblem),
    retries: Number(v.retries ?? 0),
    retryAt: str(v.retryAt),
    stateSince: str(v.stateSince),
    lastFetch: v.lastFetch
      ? Object.fromEntries(Object.entries(v.lastFetch).map(([k, t]) => [String(k), String(t)]))
      : undefined,
    firstFetch: v.firstFetch
      ? Object.fromEntries(Object.entries(v.firstFetch).map(([k, t]) => [String(k), String(t)]))
      : undefined,
    // A flag, never the serial: its token is a capability (status/snapshot.ts).
    servedOverHttp: v.servedOverHttp === true ? true : undefined,
    dependencies: v.dependencies?.map((d) =>
      defined({
        kind: d.kind === 'ConfigMap' ? 'ConfigMap' : 'Secret',
        namespace: String(d.namespace),
        name: String(d.name),
        state: d.state === 'exists' || d.state === 'absent' ? d.state : 'unknown',
        immutable: d.immutable === true,
        changedAt: str(d.changedAt),
      }),
    ),
    stale: v.stale ? projectProblem(v.stale) : undefined,
    progressNotReported: str(v.progressNotReported),
  });
}

const FIRST_BOOT_WATCH = new Set(['polling', 'read', 'not-read', 'domain-gone', 'not-polled']);

function projectFirstBoot(f: FirstBoot): FirstBoot {
  return defined({
    domainStartedAt: str(f.domainStartedAt),
    attachedAt: String(f.attachedAt),
    attachAfterStartSeconds: num(f.attachAfterStartSeconds),
    seedReadAt: str(f.seedReadAt),
    readAfterStartSeconds: num(f.readAfterStartSeconds),
    readAfterAttachSeconds: num(f.readAfterAttachSeconds),
    watch: FIRST_BOOT_WATCH.has(f.watch) ? f.watch : 'polling',
  });
}

function projectSourceError(e: SourceError): SourceError {
  return {
    file: String(e.file),
    code: e.code,
    message: String(e.message),
    at: String(e.at),
    vmis: (e.vmis ?? []).map(String),
  };
}

function projectWatch(w: WatchStatus): WatchStatus {
  return defined({
    mode: w.mode,
    synced: Boolean(w.synced),
    connected: Boolean(w.connected),
    stale: Boolean(w.stale),
    restarts: Number(w.restarts),
    lastEventAt: str(w.lastEventAt),
    lastError: str(w.lastError),
    sourceErrors: Array.isArray(w.sourceErrors) ? w.sourceErrors.map(projectSourceError) : undefined,
  });
}

export function projectSnapshot(s: AgentStatusSnapshot): AgentStatusSnapshot {
  const config: Record<string, string | number | boolean> = {};
  for (const [k, v] of Object.entries(s.config ?? {})) {
    if (typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean') config[k] = v;
  }
  return {
    version: String(s.version),
    nodeName: String(s.nodeName),
    startedAt: String(s.startedAt),
    config,
    watch: projectWatch(s.watch),
    queue: { depth: Number(s.queue.depth), inFlight: Number(s.queue.inFlight) },
    vmis: s.vmis.map(projectVmi),
    recentGenerations: s.recentGenerations.map((g) => ({ at: String(g.at), seconds: Number(g.seconds) })),
    ...(s.readiness
      ? {
          readiness: {
            ready: Boolean(s.readiness.ready),
            reasons: (s.readiness.reasons ?? []).map(String),
            at: String(s.readiness.at),
            ...(s.readiness.degraded?.length ? { degraded: s.readiness.degraded.map(String) } : {}),
          },
        }
      : {}),
    ...(s.redirect ? { redirect: projectRedirect(s.redirect) } : {}),
    ...(s.libvirt ? { libvirt: projectLibvirt(s.libvirt) } : {}),
    ...(s.cloudInitSchemas !== undefined ? { cloudInitSchemas: String(s.cloudInitSchemas) } : {}),
  };
}

function projectLibvirt(l: LibvirtStatus): LibvirtStatus {
  const count = (v: unknown) => num(v) ?? 0;
  return {
    memoryBudget: { limit: count(l.memoryBudget?.limit), used: count(l.memoryBudget?.used) },
    connections: (l.connections ?? []).map((c): LibvirtConnectionStatus => ({
      uri: String(c.uri),
      connected: Boolean(c.connected),
      watched: Boolean(c.watched),
      eventsReceived: count(c.eventsReceived),
      eventsDropped: count(c.eventsDropped),
      eventsCoalesced: count(c.eventsCoalesced),
      eventNamesTooLong: count(c.eventNamesTooLong),
      cachedDomains: count(c.cachedDomains),
      cacheBytes: count(c.cacheBytes),
      bufferedBytes: count(c.bufferedBytes),
      cuts: Object.fromEntries(Object.entries(c.cuts ?? {}).map(([k, v]) => [String(k), count(v)])),
      lastCut: c.lastCut ? { reason: String(c.lastCut.reason), message: String(c.lastCut.message) } : undefined,
      backoffMs: count(c.backoffMs),
    })),
  };
}

const REDIRECT_STATES: ReadonlyArray<RedirectStatus['state']> = ['in-place', 'missing', 'elsewhere', 'unreachable'];

function projectRedirect(r: RedirectStatus): RedirectStatus {
  return defined({
    state: REDIRECT_STATES.includes(r.state) ? r.state : 'unreachable',
    reason: str(r.reason),
    since: String(r.since),
    checkedAt: String(r.checkedAt),
  });
}

// Not ready, or ready but degraded: the reasons /readyz gives, first thing on the page.
function readinessPanel(r: AgentStatusSnapshot['readiness'], now: Date): string {
  if (r?.ready && r.degraded?.length)
    return `<section class="panel" id="readiness" data-degraded="true"><h2>Degraded <span class="badge b-warn">/readyz 200</span></h2><ul>${r.degraded
      .map((x) => `<li class="err">${esc(x)}</li>`)
      .join('')}</ul><div class="muted">checked ${esc(formatAgo(r.at, now))}</div></section>`;
  if (!r || r.ready) return '';
  return `<section class="panel" id="readiness"><h2>Not ready <span class="badge b-bad">/readyz 503</span></h2><ul>${r.reasons
    .map((x) => `<li class="err">${esc(x)}</li>`)
    .join('')}</ul><div class="muted">checked ${esc(formatAgo(r.at, now))}</div></section>`;
}

export function stateCounts(vmis: readonly VmiStatusRecord[]): Record<VmiState, number> {
  const counts = Object.fromEntries(VMI_STATES.map((s) => [s, 0])) as Record<VmiState, number>;
  for (const v of vmis) if (v.state in counts) counts[v.state]++;
  return counts;
}

// What /status.json returns: the projected snapshot, the counts, and the
// VMIs narrowed to the state filter when one is given.
export function statusJson(s: AgentStatusSnapshot, filter: VmiState | undefined, now: Date) {
  const p = projectSnapshot(s);
  return {
    generatedAt: now.toISOString(),
    ...p,
    counts: stateCounts(p.vmis),
    provisioningCounts: provisioningCounts(p.vmis),
    filter: filter ?? null,
    vmis: filter ? p.vmis.filter((v) => v.state === filter) : p.vmis,
  };
}

// ---- page chrome ----

// The one stylesheet, inline; its hash goes into the CSP so no
// 'unsafe-inline' is needed.
export const STYLE = `
:root{--ready:#1a7f37;--ready-bg:#dafbe1;--warning:#9a6700;--warning-bg:#fff8c5;--error:#cf222e;--error-bg:#ffebe9;--pending:#0969da;--pending-bg:#ddf4ff;--skipped:#57606a;--skipped-bg:#eaeef2;--line:#d0d7de;--muted:#57606a}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1f2328;background:#f6f8fa}
header{background:#1f2328;color:#fff;padding:10px 20px;display:flex;flex-wrap:wrap;gap:6px 24px;align-items:baseline}
header h1{font-size:18px;margin:0}
header .meta{color:#c9d1d9;font-size:13px}
header a{color:#fff}
main{padding:16px 20px;max-width:1600px}
a{color:#0969da}
.mono,code{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12.5px}
.counts{display:flex;flex-wrap:wrap;gap:8px;margin:0 0 14px;padding:0;list-style:none}
.counts a{display:block;padding:6px 14px;border:1px solid var(--line);border-radius:20px;background:#fff;text-decoration:none;color:#1f2328;font-weight:600}
.counts a b{font-size:17px;margin-left:6px}
.counts a.current{outline:3px solid #1f2328;outline-offset:1px}
.counts a.s-error{color:var(--error);background:var(--error-bg);border-color:var(--error)}
.counts a.s-warning{color:var(--warning);background:var(--warning-bg);border-color:var(--warning)}
.counts a.s-ready{color:var(--ready);background:var(--ready-bg);border-color:var(--ready)}
.counts a.s-pending{color:var(--pending);background:var(--pending-bg);border-color:var(--pending)}
.counts a.s-skipped{color:var(--skipped);background:var(--skipped-bg);border-color:var(--skipped)}
.counts a.zero{opacity:.55}
.panels{display:flex;flex-wrap:wrap;gap:16px;margin-bottom:16px}
.panel{background:#fff;border:1px solid var(--line);border-radius:6px;padding:10px 14px}
.panel h2{font-size:13px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted);margin:0 0 6px}
.kv{border-collapse:collapse}
.kv th{text-align:left;font-weight:500;color:var(--muted);padding:1px 12px 1px 0;vertical-align:top}
.kv td{padding:1px 0}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:700;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
.b-ok{background:var(--ready-bg);color:var(--ready)}
.b-bad{background:var(--error-bg);color:var(--error)}
.b-warn{background:var(--warning-bg);color:var(--warning)}
table.vmis{border-collapse:collapse;width:100%;background:#fff;border:1px solid var(--line)}
table.vmis th{position:sticky;top:0;background:#eaeef2;text-align:left;padding:6px 8px;font-size:12px;color:#1f2328;border-bottom:1px solid var(--line)}
table.vmis td{padding:6px 8px;border-bottom:1px solid #eaeef2;vertical-align:top;overflow-wrap:anywhere}
table.vmis tr.r-error td{background:#fff5f5}
table.vmis tr.r-error td:first-child{box-shadow:inset 4px 0 var(--error)}
table.vmis tr.r-warning td:first-child{box-shadow:inset 4px 0 var(--warning)}
table.vmis tr.r-ready td:first-child{box-shadow:inset 4px 0 var(--ready)}
table.vmis tr.r-pending td:first-child{box-shadow:inset 4px 0 var(--pending)}
table.vmis tr.r-skipped td:first-child{box-shadow:inset 4px 0 var(--skipped)}
.state{display:inline-block;min-width:68px;text-align:center;padding:2px 8px;border-radius:4px;font-weight:700;font-size:12px;text-transform:uppercase}
.state-error{background:var(--error);color:#fff}
.state-warning{background:#d4a72c;color:#1f2328}
.state-ready{background:var(--ready);color:#fff}
.state-pending{background:var(--pending);color:#fff}
.state-skipped{background:var(--skipped-bg);color:var(--skipped)}
.name{font-weight:600}
.ns{color:var(--muted)}
.err{color:var(--error)}
.err code{font-weight:700}
.warn{color:var(--warning)}
.muted{color:var(--muted)}
.num{text-align:right;white-space:nowrap}
.nowrap{white-space:nowrap}
.path{overflow-wrap:anywhere}
table.vmis td.vmi-name{min-width:11em}
table.vmis td.path{min-width:9em}
table.vmis td.problems{min-width:16em}
table.vmis.files{width:auto;min-width:480px}
.state,table.vmis td.when{overflow-wrap:normal}
.state{white-space:nowrap}
.badge{overflow-wrap:normal}
.clamp{display:-webkit-box;-webkit-box-orient:vertical;-webkit-line-clamp:4;line-clamp:4;overflow:hidden}
.filter{display:flex;flex-wrap:wrap;align-items:center;gap:6px 10px;margin:0 0 8px}
.filter input{font:inherit;width:28em;max-width:100%;padding:4px 8px;border:1px solid var(--line);border-radius:6px}
.filter button{font:inherit;padding:4px 12px;border:1px solid var(--line);border-radius:6px;background:#fff}
header h1 .mono{font-size:inherit}
.empty{padding:24px;text-align:center;color:var(--muted);background:#fff;border:1px solid var(--line)}
footer{padding:12px 20px;color:var(--muted);font-size:12px}
`;

export const STYLE_HASH = `sha256-${createHash('sha256').update(STYLE).digest('base64')}`;

// Strict: nothing loads from anywhere, the one stylesheet and the one
// script (the filter box's) are allowed by hash, and forms submit only to
// this agent (the filter box is a GET form). img-src data: only for the
// empty favicon.
export const CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  `style-src '${STYLE_HASH}'`,
  'img-src data:',
  `script-src '${FILTER_SCRIPT_HASH}'`,
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

interface PageOptions {
  title: string;
  refreshSeconds?: number;
  header: string;
  body: string;
  // The filter box's script: filters as the user types and reloads the page itself.
  script?: boolean;
}

function page(o: PageOptions): string {
  const seconds = o.refreshSeconds ? Math.max(1, Math.floor(o.refreshSeconds)) : 0;
  // meta refresh reloads the same URL, query string included, so a filter
  // survives the refresh without any script. With the script, it is the
  // script's job: meta refresh would reload the URL the page came from, not
  // the one the script has put the typed query in.
  const meta = seconds ? `<meta http-equiv="refresh" content="${seconds}">` : '';
  const refresh = o.script && meta ? `<noscript>${meta}</noscript>` : meta;
  const bodyAttrs = o.script && seconds ? ` data-refresh="${seconds}"` : '';
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">${refresh}
<title>${esc(o.title)}</title><link rel="icon" href="data:,"><style>${STYLE}</style></head>
<body${bodyAttrs}><header>${o.header}</header><main>${o.body}</main>${o.script ? `<script>${FILTER_SCRIPT}</script>` : ''}</body></html>
`;
}

function headerFor(s: AgentStatusSnapshot, now: Date): string {
  return `<h1><a href="/status">vmseed</a> · node <span class="mono">${esc(s.nodeName)}</span></h1>
<span class="meta">version ${esc(s.version)} · started ${esc(formatTime(s.startedAt))} (${esc(formatAgo(s.startedAt, now))}) · rendered ${esc(formatTime(now.toISOString()))}</span>`;
}

function yesNo(ok: boolean, good: string, bad: string): string {
  return ok ? `<span class="badge b-ok">${esc(good)}</span>` : `<span class="badge b-bad">${esc(bad)}</span>`;
}

// Degraded: the watch works, but a manifest does not read or parse, so
// what the page shows for its VMIs may lag the file.
function watchHealth(w: WatchStatus): 'healthy' | 'degraded' | 'unhealthy' {
  if (!(w.synced && w.connected && !w.stale)) return 'unhealthy';
  return w.sourceErrors?.length ? 'degraded' : 'healthy';
}

const HEALTH_BADGE = { healthy: 'b-ok', degraded: 'b-warn', unhealthy: 'b-bad' } as const;

function watchPanel(w: WatchStatus, queue: AgentStatusSnapshot['queue'], now: Date): string {
  const broken = w.sourceErrors?.length ?? 0;
  const health = watchHealth(w);
  return `<section class="panel" id="watch" data-health="${health}"><h2>Watch <span class="badge ${HEALTH_BADGE[health]}">${health}</span></h2>
<table class="kv">
<tr><th>mode</th><td>${esc(w.mode)}</td></tr>
<tr><th>synced</th><td>${yesNo(w.synced, 'synced', 'not synced')}</td></tr>
<tr><th>connected</th><td>${yesNo(w.connected, 'connected', 'disconnected')}</td></tr>
<tr><th>stale</th><td>${w.stale ? '<span class="badge b-bad">stale</span>' : '<span class="badge b-ok">fresh</span>'}</td></tr>
<tr><th>restarts</th><td>${esc(w.restarts)}</td></tr>
<tr><th>last event</th><td>${esc(formatTime(w.lastEventAt))} <span class="muted">${esc(formatAgo(w.lastEventAt, now))}</span></td></tr>
${w.lastError ? `<tr><th>last error</th><td class="err">${esc(w.lastError)}</td></tr>` : ''}
${w.sourceErrors ? `<tr><th>manifests</th><td${broken ? ' class="err"' : ''}>${broken ? `${esc(broken)} broken (<a href="#source-errors">below</a>)` : 'all parse'}</td></tr>` : ''}
<tr><th>queue</th><td>${esc(queue.depth)} waiting · ${esc(queue.inFlight)} in flight</td></tr>
</table></section>`;
}

// Local mode: each manifest that does not read or parse, and the VMIs
// whose seed is from its last good version.
function sourceErrorsPanel(errors: SourceError[] | undefined, now: Date): string {
  if (!errors?.length) return '';
  const rows = errors.map(
    (e) =>
      `<tr data-file="${esc(e.file)}"><td class="mono path">${pathHtml(e.file)}</td><td class="err"><code>${esc(e.code)}</code>: ${esc(e.message)}</td><td class="nowrap"><span class="muted">${esc(formatAgo(e.at, now))}</span></td><td>${
        e.vmis.length
          ? e.vmis
              .map(
                (k) =>
                  `<a href="${esc(vmiHref({ namespace: k.slice(0, k.indexOf('/')), name: k.slice(k.indexOf('/') + 1) }))}">${esc(k)}</a>`,
              )
              .join('<br>')
          : '<span class="muted">none</span>'
      }</td></tr>`,
  );
  return `<section class="panel" id="source-errors"><h2>Manifest errors <span class="badge b-bad">${esc(errors.length)}</span></h2>
<table class="kv"><tr><th>file</th><th>error</th><th>since</th><th>stale VMIs</th></tr>${rows.join('')}</table></section>`;
}

// The libvirt daemons the agent talks to over RPC: a launcher that floods,
// drips or overfills is cut and backed off, and shows here.
function libvirtPanel(l: LibvirtStatus | undefined): string {
  if (!l) return '';
  const cut = l.connections.some((c) => Object.keys(c.cuts).length > 0);
  const rows = l.connections.map((c) => {
    const cuts = Object.entries(c.cuts)
      .map(([reason, n]) => `${reason} ×${n ?? 0}`)
      .join(', ');
    return `<tr data-uri="${esc(c.uri)}"><td class="mono">${esc(c.uri)}</td><td>${c.connected ? 'connected' : 'closed'}${c.watched ? ' · watched' : ''}</td><td>${esc(c.eventsReceived)} / ${esc(c.eventsDropped)}</td><td${cuts ? ' class="err"' : ''}>${cuts ? esc(cuts) : '—'}${c.lastCut ? `<br><span class="muted">${esc(c.lastCut.message)}</span>` : ''}</td><td>${c.backoffMs > 0 ? esc(formatSeconds(c.backoffMs / 1000)) : '—'}</td></tr>`;
  });
  return `<section class="panel" id="libvirt" data-cut="${cut}"><h2>libvirt connections ${cut ? '<span class="badge b-bad">cut</span>' : ''}</h2>
<p class="muted">memory budget ${esc(formatBytes(l.memoryBudget.used))} of ${esc(formatBytes(l.memoryBudget.limit))}</p>
${rows.length ? `<table class="kv"><tr><th>URI</th><th>state</th><th>events / dropped</th><th>cuts</th><th>backoff</th></tr>${rows.join('')}</table>` : '<p class="muted">no connection yet</p>'}</section>`;
}

// Whether guests' 169.254.169.254 reaches the datasource (the sidecar's
// view, polled): shown only when --redirect-status-url is set.
function redirectPanel(r: RedirectStatus | undefined, now: Date): string {
  if (!r) return '';
  const badge =
    r.state === 'in-place'
      ? '<span class="badge b-ok">in place</span>'
      : r.state === 'missing'
        ? '<span class="badge b-bad">missing</span>'
        : r.state === 'elsewhere'
          ? '<span class="badge b-bad">redirect reaches something else</span>'
          : '<span class="badge b-bad">unreachable</span>';
  return `<section class="panel" id="redirect" data-redirect="${esc(r.state)}"><h2>169.254.169.254 redirect ${badge}</h2>
<table class="kv">
<tr><th>since</th><td>${esc(formatTime(r.since))} <span class="muted">${esc(formatAgo(r.since, now))}</span></td></tr>
${r.reason ? `<tr><th>reason</th><td class="err">${esc(r.reason)}</td></tr>` : ''}
<tr><th>checked</th><td><span class="muted">${esc(formatAgo(r.checkedAt, now))}</span></td></tr>
</table></section>`;
}

function configPanel(config: Record<string, string | number | boolean>, schemas: string | undefined): string {
  const rows = Object.keys(config)
    .sort()
    .map((k) => `<tr><th>${esc(k)}</th><td class="mono">${esc(config[k])}</td></tr>`)
    .join('');
  // cloud-init's schemas as read at start: which releases seeds can be checked against.
  const line = schemas !== undefined ? `<p id="cloud-init-schemas">cloud-init schemas: ${esc(schemas)}</p>` : '';
  return `<section class="panel" id="config"><h2>Configuration</h2>${line}<table class="kv">${rows || '<tr><td class="muted">none</td></tr>'}</table></section>`;
}

// Let long paths wrap at their slashes rather than mid-name.
function pathHtml(path: string | undefined): string {
  if (!path) return '<span class="muted">—</span>';
  return esc(path).replace(/\//g, '/<wbr>');
}

// A 63-character namespace and name make a path or domain of 130 and more:
// past a few lines the row is cut short, the whole of it in the tooltip
// and on the VMI's own page.
function clamped(full: string | undefined, html: string): string {
  return full ? `<span class="clamp" title="${esc(full)}">${html}</span>` : html;
}

// "retry 3 at 12:00:05 (in 4s)": the queue's next run of a waiting or
// failed VMI, or only the count once that run is under way.
function retryLine(v: VmiStatusRecord, now: Date): string {
  const n = `retry ${v.retries}`;
  const at = v.retryAt ? Date.parse(v.retryAt) : NaN;
  if (Number.isNaN(at)) return n;
  const secs = Math.max(0, Math.round((at - now.getTime()) / 1000));
  return `${n} at ${formatTime(v.retryAt)} (${secs > 0 ? `in ${formatSeconds(secs)}` : 'due'})`;
}

function stateLabel(state: VmiState): string {
  return `<span class="state state-${esc(state)}">${esc(state)}</span>`;
}

function shortHash(hash: string | undefined): string {
  if (!hash) return '<span class="muted">—</span>';
  return `<span class="mono nowrap" title="${esc(hash)}">${esc(hash.slice(0, 12))}${hash.length > 12 ? '…' : ''}</span>`;
}

export function vmiHref(v: Pick<VmiStatusRecord, 'namespace' | 'name'>): string {
  return `/status/${encodeURIComponent(v.namespace)}/${encodeURIComponent(v.name)}`;
}

function problemHtml(p: StatusProblem, cls: string): string {
  return `<div class="${cls}"><code>${esc(p.code)}</code>${p.field ? ` <span class="mono">(${esc(p.field)})</span>` : ''}: ${esc(p.message)}</div>`;
}

function injectionCell(v: VmiStatusRecord): string {
  const i = v.injection;
  if (!i) return '<span class="muted">—</span>';
  return `<span class="mono">${clamped(i.domain, esc(i.domain))} → ${esc(i.targetDev)}</span> <span class="muted">(${esc(i.bus)})</span><br><span class="muted">${esc(i.flags.join(' ') || 'no flags')} · ${esc(i.domainState)}${i.resumed ? ' · resumed' : ''}</span>`;
}

function seededAfterBootCell(v: VmiStatusRecord): string {
  if (!v.injection) return '<span class="muted">—</span>';
  return v.injection.seededAfterBoot
    ? '<span class="badge b-warn" title="the guest may have booted without its seed">yes</span>'
    : 'no';
}

// When the guest first fetched the file, if not the last time shown.
function firstFetchNote(v: VmiStatusRecord, file: string): string {
  const first = v.firstFetch?.[file];
  if (first === undefined || first === v.lastFetch?.[file]) return '';
  return `<br><span class="muted">first at ${esc(formatTime(first))}</span>`;
}

// The list's short form: the attach margin and the guest's read.
function firstBootLine(v: VmiStatusRecord): string {
  const f = v.firstBoot;
  if (!f) return '';
  const margin =
    f.attachAfterStartSeconds === undefined
      ? 'start not seen'
      : `attached ${formatSeconds(f.attachAfterStartSeconds)} after start`;
  return `<br><span class="muted">${esc(margin)} · ${esc(readText(f))}</span>`;
}

function readText(f: FirstBoot): string {
  if (f.watch === 'read')
    return f.readAfterStartSeconds !== undefined
      ? `read by guest ${formatSeconds(f.readAfterStartSeconds)} after start`
      : `read by guest ${formatSeconds(f.readAfterAttachSeconds)} after attach`;
  return FIRST_BOOT_WATCH_TEXT[f.watch];
}

const FIRST_BOOT_WATCH_TEXT: Record<FirstBoot['watch'], string> = {
  polling: 'not read yet (watching)',
  read: 'read by guest',
  'not-read': 'not read while watched',
  'domain-gone': 'the domain went before a read',
  'not-polled': 'not watched (too many at once)',
};

function firstBootRows(f: FirstBoot, row: (k: string, val: string) => string): string {
  const at = (iso: string | undefined, after: string) =>
    iso === undefined ? '<span class="muted">not seen by this agent</span>' : `${esc(formatTime(iso))}${after}`;
  const since = (s: number | undefined, what: string) =>
    s === undefined ? '' : ` <span class="muted">(${esc(formatSeconds(s))} after ${what})</span>`;
  return [
    row('domain started', at(f.domainStartedAt, '')),
    row('seed attached', at(f.attachedAt, since(f.attachAfterStartSeconds, 'the start'))),
    row(
      'seed read by guest',
      f.seedReadAt === undefined
        ? `<span class="muted">${esc(FIRST_BOOT_WATCH_TEXT[f.watch])}</span>`
        : at(f.seedReadAt, since(f.readAfterStartSeconds, 'the start') + since(f.readAfterAttachSeconds, 'the attach')),
    ),
  ].join('');
}

// Errors first: the row someone is looking for at 3 a.m. is at the top.
function sortVmis(vmis: VmiStatusRecord[]): VmiStatusRecord[] {
  const rank = (s: VmiState) => VMI_STATES.indexOf(s);
  return [...vmis].sort(
    (a, b) => rank(a.state) - rank(b.state) || a.namespace.localeCompare(b.namespace) || a.name.localeCompare(b.name),
  );
}

// "Did cloud-init even ask?": the last user-data fetch over HTTP.
function fetchedCell(v: VmiStatusRecord, now: Date): string {
  const at = v.lastFetch?.['user-data'];
  if (at === undefined) return v.servedOverHttp ? '<br><span class="muted">not fetched over HTTP</span>' : '';
  return `<br><span class="muted" title="${esc(formatTime(at))}">the guest fetched user-data ${esc(formatAgo(at, now))}</span>`;
}

function staleBadge(v: VmiStatusRecord): string {
  return v.stale ? `<br><span class="badge b-warn" title="${esc(v.stale.message)}">stale</span>` : '';
}

function vmiRow(v: VmiStatusRecord, now: Date, shown: boolean): string {
  const problems = [
    v.stale ? problemHtml(v.stale, 'warn') : '',
    v.lastError ? problemHtml(v.lastError, 'err') : '',
    ...v.warnings.map((w) => problemHtml(w, 'warn')),
    v.retries > 0 ? `<div class="muted">${esc(retryLine(v, now))}</div>` : '',
  ].join('');
  return `<tr class="vmi r-${esc(v.state)}" data-state="${esc(v.state)}"${v.stale ? ' data-stale="true"' : ''}${shown ? '' : ' hidden'}>
<td>${stateLabel(v.state)}${staleBadge(v)}</td>
<td class="vmi-name"><a class="name" href="${esc(vmiHref(v))}">${esc(v.name)}</a><br><span class="ns">${esc(v.namespace)}</span></td>
<td>${esc(v.datasource ?? '—')}${v.adopted ? ' <span class="muted">adopted</span>' : ''}${fetchedCell(v, now)}</td>
<td class="mono path">${clamped(v.imagePath, pathHtml(v.imagePath))}</td>
<td class="num">${esc(formatBytes(v.imageBytes))}</td>
<td>${shortHash(v.contentHash)}</td>
<td class="when">${esc(formatTime(v.generatedAt))}<br><span class="muted">${esc(formatAgo(v.generatedAt, now))}</span></td>
<td class="num">${esc(formatSeconds(v.generationSeconds))}</td>
<td>${injectionCell(v)}</td>
<td>${seededAfterBootCell(v)}${firstBootLine(v)}${provisioningLine(v)}</td>
<td class="problems">${problems || '<span class="muted">—</span>'}</td>
</tr>`;
}

export interface StatusPageOptions {
  now: Date;
  filter?: VmiState;
  // The filter box's text, as parseQuery() returns it: rows it does not match are hidden.
  query?: string;
  // The page's one script: the filter box filters as the user types and the
  // reload keeps what was typed. The router turns it on; without it the
  // page carries no script and meta refresh reloads it.
  clientFilter?: boolean;
  refreshSeconds?: number;
  // Links to /metrics, /readyz, /healthz: only where this listener has them.
  probeLinks?: boolean;
}

export function renderStatusPage(snapshot: AgentStatusSnapshot, options: StatusPageOptions): string {
  const s = projectSnapshot(snapshot);
  const { now, filter } = options;
  const query = options.query ?? '';
  const counts = stateCounts(s.vmis);
  const pills = [
    `<li><a href="${esc(statusHref(undefined, query))}" class="s-all${filter ? '' : ' current'}" data-keep-q>all<b>${s.vmis.length}</b></a></li>`,
    ...VMI_STATES.map(
      (st) =>
        `<li><a href="${esc(statusHref(st, query))}" class="s-${st}${counts[st] === 0 ? ' zero' : ''}${filter === st ? ' current' : ''}" data-state="${st}" data-keep-q>${st}<b>${counts[st]}</b></a></li>`,
    ),
  ].join('');
  const inState = sortVmis(filter ? s.vmis.filter((v) => v.state === filter) : s.vmis);
  const matching = new Set(inState.filter((v) => matchesQuery(query, v)));
  const table = inState.length
    ? `${filterForm(query, filter, matching.size, inState.length)}<table class="vmis"><thead><tr><th>state</th><th>VMI</th><th>datasource</th><th>image</th><th>size</th><th>content hash</th><th>generated</th><th>gen. time</th><th>injection</th><th>seeded after boot</th><th>last error / warnings</th></tr></thead>
<tbody>${inState.map((v) => vmiRow(v, now, matching.has(v))).join('\n')}</tbody></table>
<p class="empty" id="filter-empty"${matching.size ? ' hidden' : ''}>no VMIs match “<span id="filter-empty-q">${esc(query.trim())}</span>”${filter ? ` in state ${esc(filter)}` : ''} · <a href="${esc(statusHref(filter, ''))}">clear the filter</a></p>`
    : `<div class="empty">${filter ? `no VMIs in state ${esc(filter)} · <a href="/status">show all</a>` : 'no VMIs on this node'}</div>`;
  const body = `${readinessPanel(s.readiness, now)}<nav><ul class="counts" aria-label="filter by state">${pills}</ul></nav>
<div class="panels">${watchPanel(s.watch, s.queue, now)}${sourceErrorsPanel(s.watch.sourceErrors, now)}${redirectPanel(s.redirect, now)}${libvirtPanel(s.libvirt)}<section class="panel" id="latency"><h2>Generation latency</h2>${renderLatencyChart(s.recentGenerations)}</section>${provisioningPanel(s.vmis)}${configPanel(s.config, s.cloudInitSchemas)}</div>
${table}
<footer>Refreshes every ${esc(options.refreshSeconds ?? 0)} s · <a href="/status.json${filter ? `?state=${filter}` : ''}">status.json</a>${(options.probeLinks ?? true) ? ' · <a href="/metrics">metrics</a> · <a href="/readyz">readyz</a> · <a href="/healthz">healthz</a>' : ''}</footer>`;
  return page({
    title: `${counts.error > 0 ? `(${counts.error} error) ` : ''}vmseed · ${s.nodeName}`,
    refreshSeconds: options.refreshSeconds,
    header: headerFor(s, now),
    body,
    script: options.clientFilter === true,
  });
}

function statusHref(state: VmiState | undefined, query: string): string {
  const params = new URLSearchParams();
  if (state) params.set('state', state);
  if (query.trim()) params.set('q', query.trim());
  const search = params.toString();
  return search ? `/status?${search}` : '/status';
}

// A GET form, so it filters with JavaScript off: the server hides the rows
// the query does not match; the script does the same as the user types.
function filterForm(query: string, state: VmiState | undefined, shown: number, total: number): string {
  return `<form class="filter" id="filter" method="get" action="/status" aria-label="filter the VMIs">
<label for="filter-q">filter</label>
<input type="text" id="filter-q" name="q" value="${esc(query)}" maxlength="${MAX_QUERY_LENGTH}" placeholder="name, namespace, state or code" title="every term must match; name:, ns:, state: or code: match one field only" autocomplete="off" spellcheck="false">
${state ? `<input type="hidden" name="state" value="${esc(state)}">` : ''}<button type="submit">apply</button>
<span class="muted" id="filter-count">${shown} of ${total} shown</span>
</form>`;
}

export function renderVmiPage(
  snapshot: AgentStatusSnapshot,
  record: VmiStatusRecord,
  options: StatusPageOptions,
): string {
  const s = projectSnapshot(snapshot);
  const v = projectVmi(record);
  const { now } = options;
  const i = v.injection;
  const row = (k: string, val: string) => `<tr><th>${esc(k)}</th><td>${val}</td></tr>`;
  const files = v.files?.length
    ? `<table class="vmis files"><thead><tr><th>file</th><th>size</th></tr></thead><tbody>${v.files
        .map(
          (f) =>
            `<tr><td class="mono path">${esc(f.path)}</td><td class="num">${esc(formatBytes(f.size))}${f.size >= 1024 ? ` <span class="muted">(${esc(f.size)} B)</span>` : ''}</td></tr>`,
        )
        .join('')}</tbody></table>`
    : '<div class="empty">no seed files recorded</div>';
  const fetchRows = Object.keys(v.lastFetch ?? {})
    .sort()
    .map((k) =>
      row(
        k,
        `the guest fetched ${esc(k)} at ${esc(formatTime(v.lastFetch![k]))} <span class="muted">${esc(formatAgo(v.lastFetch![k], now))}</span>${firstFetchNote(v, k)}`,
      ),
    );
  // The serial holds the seed's token: the page says how to get it, with
  // the key, instead of showing it to everyone who can read this page.
  const fetches =
    v.servedOverHttp || fetchRows.length
      ? `<section class="panel" id="nocloud-http"><h2>NoCloud over HTTP</h2><table class="kv">${
          v.servedOverHttp
            ? row(
                'firmware serial',
                `<span class="muted">not shown (it holds the seed's token); print it with</span> <span class="mono serial">${esc(`vmseed seed-url ${v.namespace}/${v.name} --uid ${v.uid} --key-file KEYFILE`)}</span>`,
              )
            : ''
        }${fetchRows.join('') || row('fetches', '<span class="muted">the guest has not fetched anything yet</span>')}</table></section>`
      : '';
  const problems = [
    v.stale ? problemHtml(v.stale, 'warn') : '',
    v.lastError
      ? problemHtml(v.lastError, 'err') +
        `<div class="muted">at ${esc(formatTime(v.lastError.at))}${v.lastError.kind ? ` · ${esc(v.lastError.kind)}` : ''}</div>`
      : '',
    ...v.warnings.map((w) => problemHtml(w, 'warn')),
  ].join('');
  const body = `<p><a href="/status">← all VMIs</a></p>
<h2><span class="ns">${esc(v.namespace)}/</span><span class="name">${esc(v.name)}</span> ${stateLabel(v.state)}${v.stale ? ' <span class="badge b-warn">stale</span>' : ''}</h2>
${problems ? `<section class="panel" id="problems"><h2>Problems</h2>${problems}</section><br>` : ''}
<div class="panels">
<section class="panel"><h2>Seed</h2><table class="kv">
${row('uid', `<span class="mono">${esc(v.uid)}</span>`)}
${row('datasource', esc(v.datasource ?? '—'))}
${v.adopted ? row('source', adoptedHtml(v.adopted)) : ''}
${row('image', `<span class="mono path">${pathHtml(v.imagePath)}</span>`)}
${row('size', `${esc(formatBytes(v.imageBytes))}${v.imageBytes !== undefined ? ` <span class="muted">(${esc(v.imageBytes)} B)</span>` : ''}`)}
${row('content hash', `<span class="mono">${esc(v.contentHash ?? '—')}</span>`)}
${row('generated', `${esc(formatTime(v.generatedAt))} <span class="muted">${esc(formatAgo(v.generatedAt, now))}</span>`)}
${row('generation time', esc(formatSeconds(v.generationSeconds)))}
${row('retries', esc(v.retries > 0 ? retryLine(v, now) : '0'))}
${row('in this state since', `${esc(formatTime(v.stateSince))} <span class="muted">${esc(formatAgo(v.stateSince, now))}</span>`)}
</table></section>
<section class="panel"><h2>Injection</h2><table class="kv">
${i ? [row('domain', `<span class="mono">${esc(i.domain)}</span>`), row('target', `<span class="mono">${esc(i.targetDev)}</span> (${esc(i.bus)})`), row('flags', `<span class="mono">${esc(i.flags.join(' ') || '—')}</span>`), row('domain state', esc(i.domainState)), row('seeded after boot', seededAfterBootCell(v)), row('resumed', i.resumed ? 'yes' : 'no'), row('at', esc(formatTime(i.at)))].join('') : row('injection', `<span class="muted">${s.config.libvirt === 'off' ? 'off (--libvirt off): the image is only written to disk' : 'not injected'}</span>`)}
</table></section>
${v.firstBoot ? `<section class="panel" id="first-boot"><h2>First boot</h2><table class="kv">${firstBootRows(v.firstBoot, row)}</table></section>` : ''}
${provisioningTimeline(v)}
${fetches}
${dependenciesHtml(v, now)}
</div>
<h3>Seed files</h3>
${files}`;
  return page({
    title: `${v.namespace}/${v.name} · vmseed`,
    refreshSeconds: options.refreshSeconds,
    header: headerFor(s, now),
    body,
  });
}

// The Secrets and ConfigMaps the seed was rendered from: names only, never content.
function dependenciesHtml(v: VmiStatusRecord, now: Date): string {
  const deps = v.dependencies ?? [];
  if (deps.length === 0) return '';
  const rows = deps
    .map((d) => {
      const state =
        d.state === 'absent' ? '<span class="err">does not exist</span>' : d.state === 'unknown' ? 'not read yet' : '';
      const watched = d.immutable ? 'immutable, not watched' : 'watched';
      const changed = d.changedAt
        ? `changed ${esc(formatTime(d.changedAt))} <span class="muted">${esc(formatAgo(d.changedAt, now))}</span>`
        : '';
      return `<tr><th>${esc(d.kind)}</th><td><span class="mono">${esc(`${d.namespace}/${d.name}`)}</span> ${state} <span class="muted">${watched}</span><br>${changed}</td></tr>`;
    })
    .join('');
  return `<section class="panel" id="dependencies"><h2>Depends on</h2><table class="kv">${rows}</table></section>`;
}

export function renderNotFoundPage(what: string): string {
  return page({
    title: 'not found · vmseed',
    header: '<h1><a href="/status">vmseed</a></h1>',
    body: `<div class="empty"><h2>Not found</h2><p>${esc(what)}</p><p><a href="/status">back to the status page</a></p></div>`,
  });
}
