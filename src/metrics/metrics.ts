// Every metric vmseed exports, in one private registry. Labels are bounded:
// error codes come from the closed list in src/errors.ts, and namespace/name
// appear only on the per-VMI series, bounded by the VMIs on this node (the
// detail of each lives on the status page).
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { registerEventLoopLag } from './eventloop-lag.ts';

// From 50 µs (an in-memory build of a small seed) to 10 s (a slow API server).
const LATENCY_BUCKETS = [
  0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
];
// virsh round trips and the time a VM owner waits: 1 ms to 5 min.
const SLOW_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
// A domain's start to our disk in it: 1 ms to 5 min, finest where the
// guest's firmware is still running.
const MARGIN_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];
// A guest's boot to cloud-init's final stage: 5 s to 2 h.
const PROVISIONING_BUCKETS = [5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 1800, 3600, 7200];
/** The `name` label of the work-queue series: the agent's one queue, of VMI keys. */
export const QUEUE_NAME = 'vmi';
export const WEBHOOK_RESULTS = ['patched', 'unchanged', 'refused', 'error'] as const;
/** The `result` label of vmseed_webhook_requests_total. */
export type WebhookResult = (typeof WEBHOOK_RESULTS)[number];
export const ANNOTATION_WRITE_RESULTS = ['success', 'forbidden', 'refused', 'error'] as const;
/** The `result` label of vmseed_vmi_annotation_writes_total. */
export type AnnotationWriteResult = (typeof ANNOTATION_WRITE_RESULTS)[number];

// 4 KiB (minimum image) to 64 MiB.
const SIZE_BUCKETS = [4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864];

export interface MetricsOptions {
  version: string;
  // Default process metrics (CPU, RSS, event loop lag); off in tests that
  // create many registries.
  processMetrics?: boolean;
}

// State that only the agent holds (its queue, its VMI source), read at
// scrape time so the gauges are exact when scraped, not as old as a timer.
export interface LiveProbes {
  queue?: () => { longestRunningSeconds: number; unfinishedSeconds: number };
  watch?: () => {
    synced: boolean;
    connected: boolean;
    stale: boolean;
    lastEventAt?: string;
    sourceErrors?: readonly unknown[];
  };
  provisioning?: () => { counts: Record<string, number>; oldestRunningSeconds: number };
}

/**
 * Every vmseed metric, in a registry of its own; bounded label sets start at
 * 0 so a series exists from the first scrape.
 */
export function createMetrics(options: MetricsOptions) {
  const registry = new Registry();
  const live: LiveProbes = {};
  if (options.processMetrics !== false) {
    // Event-loop lag sampled every 100 ms, not prom-client's 10 ms: a 100 Hz
    // timer is most of an idle agent's CPU (docs/operations.md, "Measured"
    // under Resources), and the lag that matters here (blocks of tens of ms
    // and more) still shows.
    // prom-client's own delay histogram reports the resolution as lag; it is
    // left idle (one tick an hour) and replaced by one that subtracts it.
    collectDefaultMetrics({ register: registry, prefix: 'vmseed_', eventLoopMonitoringPrecision: 3_600_000 });
    registerEventLoopLag(registry, 'vmseed_', 100);
    // prom-client exports these sums as gauges named *_total, which
    // `promtool check metrics` rejects (only counters end in _total); the
    // per-type series (vmseed_nodejs_active_handles{type}) carry the same.
    for (const n of ['handles', 'requests', 'resources'])
      registry.removeSingleMetric(`vmseed_nodejs_active_${n}_total`);
  }
  const registers = [registry];

  const m = {
    registry,
    seedGenerationDuration: new Histogram({
      name: 'vmseed_seed_generation_duration_seconds',
      help: 'From the start of a reconcile to the seed image on disk: resolve references, render, build, write.',
      labelNames: ['datasource', 'result'] as const,
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    imageBuildDuration: new Histogram({
      name: 'vmseed_image_build_duration_seconds',
      help: 'In-memory ISO 9660 build of a seed image.',
      labelNames: ['datasource'] as const,
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    injectionDuration: new Histogram({
      name: 'vmseed_injection_duration_seconds',
      help: 'Time to attach, detach or replace the seed disk in the libvirt domain.',
      labelNames: ['operation', 'result'] as const,
      buckets: SLOW_BUCKETS,
      registers,
    }),
    seedReadyLatency: new Histogram({
      name: 'vmseed_seed_ready_latency_seconds',
      help: 'From VMI creation (or first sight by this agent, whichever is later) to its seed being in place.',
      buckets: SLOW_BUCKETS,
      registers,
    }),
    reconcileTotal: new Counter({
      name: 'vmseed_reconcile_total',
      help: "Reconciles by outcome: success, waiting (for what a VM start normally brings: its launcher pod, libvirt, domain, KubeVirt's pause, the cluster component; retried with backoff, no error), error (retryable: backed off and requeued), terminal (waits for the VMI to change).",
      labelNames: ['result'] as const,
      registers,
    }),
    reconcileErrors: new Counter({
      name: 'vmseed_reconcile_errors_total',
      help: 'Reconcile errors by stable error code.',
      labelNames: ['code'] as const,
      registers,
    }),
    // client-go's work-queue metrics, under its names and `name` label, so
    // dashboards made for controllers read vmseed's queue as they are.
    queueDepth: new Gauge({
      name: 'workqueue_depth',
      help: 'Current depth of workqueue',
      labelNames: ['name'] as const,
      registers,
    }),
    queueAdds: new Counter({
      name: 'workqueue_adds_total',
      help: 'Total number of adds handled by workqueue',
      labelNames: ['name'] as const,
      registers,
    }),
    queueLatency: new Histogram({
      name: 'workqueue_queue_duration_seconds',
      help: 'How long in seconds an item stays in workqueue before being requested.',
      labelNames: ['name'] as const,
      buckets: SLOW_BUCKETS,
      registers,
    }),
    queueWorkDuration: new Histogram({
      name: 'workqueue_work_duration_seconds',
      help: 'How long in seconds processing an item from workqueue takes.',
      labelNames: ['name'] as const,
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    queueRetries: new Counter({
      name: 'workqueue_retries_total',
      help: 'Total number of retries handled by workqueue',
      labelNames: ['name'] as const,
      registers,
    }),
    queueUnfinished: new Gauge({
      name: 'workqueue_unfinished_work_seconds',
      help: "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
      labelNames: ['name'] as const,
      registers,
      collect() {
        if (live.queue) this.set({ name: QUEUE_NAME }, live.queue().unfinishedSeconds);
      },
    }),
    queueLongestRunning: new Gauge({
      name: 'workqueue_longest_running_processor_seconds',
      help: 'How many seconds has the longest running processor for workqueue been running.',
      labelNames: ['name'] as const,
      registers,
      collect() {
        if (live.queue) this.set({ name: QUEUE_NAME }, live.queue().longestRunningSeconds);
      },
    }),
    // Says more than client-go's: how many workers are busy now.
    queueInFlight: new Gauge({ name: 'vmseed_workqueue_in_flight', help: 'Keys being reconciled now.', registers }),
    vmiInfo: new Gauge({
      name: 'vmseed_vmi_info',
      help: 'One series per VMI this agent holds, 1: its state on the status page and the code it waits on or failed with (empty when none).',
      labelNames: ['namespace', 'name', 'state', 'code'] as const,
      registers,
    }),
    vmiStateSince: new Gauge({
      name: 'vmseed_vmi_state_since_timestamp_seconds',
      help: 'When each VMI this agent holds entered its current state and code, in Unix seconds: time() minus it is how long a VMI has been pending on a code.',
      labelNames: ['namespace', 'name', 'state', 'code'] as const,
      registers,
    }),
    informerRestarts: new Counter({
      name: 'vmseed_informer_restarts_total',
      help: 'Informer restarts by reason: error, stale (watchdog), gone (410).',
      labelNames: ['reason'] as const,
      registers,
    }),
    informerLastEventAge: new Gauge({
      name: 'vmseed_informer_last_event_age_seconds',
      help: 'Seconds since the informer last received an event or bookmark.',
      registers,
      collect() {
        const at = live.watch?.().lastEventAt;
        if (at !== undefined) this.set(Math.max(0, (Date.now() - Date.parse(at)) / 1000));
      },
    }),
    informerSynced: new Gauge({
      name: 'vmseed_informer_synced',
      help: '1 when the VMI informer has listed and is watching.',
      registers,
      collect() {
        const w = live.watch?.();
        if (w) this.set(w.synced && w.connected && !w.stale ? 1 : 0);
      },
    }),
    sourceErrors: new Gauge({
      name: 'vmseed_source_errors',
      help: 'Local mode: manifests that do not read or parse now (their VMIs keep the seed of the last version that did).',
      registers,
      collect() {
        this.set(live.watch?.().sourceErrors?.length ?? 0);
      },
    }),
    vmis: new Gauge({
      name: 'vmseed_vmis',
      help: 'VMIs of this node by state.',
      labelNames: ['state'] as const,
      registers,
    }),
    imageBytes: new Histogram({
      name: 'vmseed_image_bytes',
      help: 'Size of written seed images.',
      labelNames: ['datasource'] as const,
      buckets: SIZE_BUCKETS,
      registers,
    }),
    // NoCloud over HTTP. endpoint is one of the four file names or `other`
    // (anything unrecognised), status the HTTP status code: both bounded.
    datasourceRequests: new Counter({
      name: 'vmseed_datasource_requests_total',
      help: 'Requests to the NoCloud HTTP datasource by endpoint (file name; imds for the IMDS paths, which vmseed_imds_requests_total breaks down by family; or other) and HTTP status.',
      labelNames: ['endpoint', 'status'] as const,
      registers,
    }),
    datasourceConnectionsRefused: new Counter({
      name: 'vmseed_datasource_connections_refused_total',
      help: 'Connections to the NoCloud HTTP datasource closed on arrival because their source address already had its share open.',
      registers,
    }),
    // reason is the header found, one of two (FORWARDING_HEADERS).
    datasourceForwardedRefused: new Counter({
      name: 'vmseed_datasource_forwarded_refused_total',
      help: 'Requests to the datasource listener refused with 400 because they carried a forwarding header, by reason: x-forwarded-for or forwarded.',
      labelNames: ['reason'] as const,
      registers,
    }),
    datasourceRequestDuration: new Histogram({
      name: 'vmseed_datasource_request_duration_seconds',
      help: 'Time to answer a NoCloud HTTP datasource request, by endpoint.',
      labelNames: ['endpoint'] as const,
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    seedGateWaiting: new Gauge({
      name: 'vmseed_seed_gate_waiting',
      help: 'VMIs held at the seed gate: seed attached, the VM still paused until KubeVirt reports it Running and Paused so that the agent can unpause it (SEED_GATE_WAITING).',
      registers,
    }),
    objectWatches: new Gauge({
      name: 'vmseed_object_watches',
      help: 'Open watches on referenced Secrets and ConfigMaps: one per mutable object a seed on this node reads.',
      registers,
    }),
    seedAttachAfterStart: new Histogram({
      name: 'vmseed_seed_attach_after_start_seconds',
      help: "From libvirt's start event of a domain, as this agent received it, to the seed disk attached to it (domains whose start this agent saw).",
      buckets: MARGIN_BUCKETS,
      registers,
    }),
    seedReadAfterStart: new Histogram({
      name: 'vmseed_seed_read_after_start_seconds',
      help: "From libvirt's start event of a domain to the guest's first read of the seed disk seen in libvirt's block statistics (polled with backoff).",
      buckets: SLOW_BUCKETS,
      registers,
    }),
    seededAfterBoot: new Counter({
      name: 'vmseed_seeded_after_boot_total',
      help: 'Seeds that came after the guest could have looked, by datasource: disk, the seed disk attached to a domain already running (not paused); nocloud-http, the guest asked the HTTP datasource with its token before the seed was served and got it later.',
      labelNames: ['datasource'] as const,
      registers,
    }),
    // KubeVirt IMDS's endpoints: family is identity, token or openstack;
    // scope which bucket refused (vm, source: resolved to no VMI, node).
    imdsRequests: new Counter({
      name: 'vmseed_imds_requests_total',
      help: 'Requests to the IMDS endpoints of the datasource (/v1/identity, /v1/token, the session PUT /v1/session, OpenStack paths) by path family and HTTP status.',
      labelNames: ['family', 'status'] as const,
      registers,
    }),
    imdsRateLimited: new Counter({
      name: 'vmseed_imds_rate_limited_total',
      help: "IMDS endpoint requests answered 429, by path family and the bucket that refused them: vm (the VMI's own), source (requests that resolve to no VMI) or node (all together).",
      labelNames: ['family', 'scope'] as const,
      registers,
    }),
    // /v1/token refused a token whose claims do not name the VMI's
    // namespace, ServiceAccount and launcher pod (TOKEN_REFUSALS).
    imdsTokenRefused: new Counter({
      name: 'vmseed_imds_token_refused_total',
      help: "/v1/token requests answered 404 because the launcher pod's token did not match the VMI, by reason: unreadable (no kubernetes.io claims), namespace, serviceaccount or pod.",
      labelNames: ['reason'] as const,
      registers,
    }),
    provisioningSeconds: new Histogram({
      name: 'vmseed_provisioning_seconds',
      help: "From the VMI's first sight by this agent to cloud-init's modules-final finish reported by the guest, by result (success, warn, fail).",
      labelNames: ['result'] as const,
      buckets: PROVISIONING_BUCKETS,
      registers,
    }),
    seedReadSeconds: new Histogram({
      name: 'vmseed_seed_read_seconds',
      help: "From the seed in place to the guest's first read of it, by how it was read: disk (attach to the first read in libvirt's block statistics) or http (seed ready to the first meta-data fetch).",
      labelNames: ['via'] as const,
      buckets: SLOW_BUCKETS,
      registers,
    }),
    provisioningFailures: new Counter({
      name: 'vmseed_provisioning_failures_total',
      help: 'Boots whose cloud-init reported FAIL, by the first failing module (cloud-init module names; anything else is other).',
      labelNames: ['module'] as const,
      registers,
    }),
    provisioningReports: new Counter({
      name: 'vmseed_provisioning_reports_total',
      help: 'cloud-init progress events accepted on the datasource listener.',
      registers,
    }),
    provisioningReportsRefused: new Counter({
      name: 'vmseed_provisioning_reports_refused_total',
      help: 'cloud-init progress reports refused on the datasource listener, by reason.',
      labelNames: ['reason'] as const,
      registers,
    }),
    provisioningVmis: new Gauge({
      name: 'vmseed_provisioning_vmis',
      help: "VMIs of this node by what their guest's cloud-init reported for the current boot: running, succeeded, bootstrapped, failed, not-reported.",
      labelNames: ['state'] as const,
      registers,
      collect() {
        const p = live.provisioning?.();
        if (p) for (const [state, n] of Object.entries(p.counts)) this.set({ state }, n);
      },
    }),
    provisioningOldestRunning: new Gauge({
      name: 'vmseed_provisioning_oldest_running_seconds',
      help: 'Seconds since the VMI first seen by this agent, of the longest one whose cloud-init has reported progress but not finished (0 when none).',
      registers,
      collect() {
        const p = live.provisioning?.();
        if (p) this.set(p.oldestRunningSeconds);
      },
    }),
    // result is one of ANNOTATION_WRITE_RESULTS.
    vmiAnnotationWrites: new Counter({
      name: 'vmseed_vmi_annotation_writes_total',
      help: 'Writes of the VMI annotation vmseed.io/provisioning by result: success, forbidden (403: the ClusterRole lacks patch on virtualmachineinstances), refused (404 or 422: the VMI gone or made again; not retried), error (unreachable, 409, 429 or 5xx after retries; retried).',
      labelNames: ['result'] as const,
      registers,
    }),
    // The admission webhook (deploy/webhook); result is one of WEBHOOK_RESULTS.
    webhookRequests: new Counter({
      name: 'vmseed_webhook_requests_total',
      help: 'Requests to the admission webhook by result: patched (a VMI admitted with a patch), unchanged (allowed without a patch), refused (answered 4xx: not an AdmissionReview, too large, wrong method or type), error (500).',
      labelNames: ['result'] as const,
      registers,
    }),
    webhookRequestDuration: new Histogram({
      name: 'vmseed_webhook_request_duration_seconds',
      help: 'Time from an admission request arriving to its answer written, body read and parsed included.',
      buckets: LATENCY_BUCKETS,
      registers,
    }),
    webhookCertificateExpiry: new Gauge({
      name: 'vmseed_webhook_certificate_expiry_timestamp_seconds',
      help: "The webhook serving certificate's notAfter in force, as Unix seconds; 0 while none is loaded.",
      registers,
    }),
    cloudInitSchemaInfo: new Gauge({
      name: 'vmseed_cloud_init_schema_info',
      help: "The cloud-init releases whose schemas seeds can be checked against, 1: state ready (the release's schema files read at start) or off (missing or unreadable; the log and the status page say why).",
      labelNames: ['release', 'state'] as const,
      registers,
    }),
    seedSchemaProblems: new Gauge({
      name: 'vmseed_seed_schema_problems',
      help: "Problems cloud-init's schema finds in the current seeds of this node's VMIs, by cloud-init module (unknown: a key no module declares; network-config) and severity (error, deprecation).",
      labelNames: ['module', 'severity'] as const,
      registers,
    }),
    buildInfo: new Gauge({
      name: 'vmseed_build_info',
      help: 'Always 1; labels carry the version of vmseed and of Node.js.',
      labelNames: ['version', 'nodejs_version'] as const,
      registers,
    }),
  };
  m.buildInfo.set({ version: options.version, nodejs_version: process.version }, 1);
  // Bounded label sets start at 0, so rate() and alerts see a series from
  // the first scrape instead of nothing until the first occurrence.
  for (const result of ['success', 'waiting', 'error', 'terminal']) m.reconcileTotal.inc({ result }, 0);
  m.queueDepth.set({ name: QUEUE_NAME }, 0);
  m.queueAdds.inc({ name: QUEUE_NAME }, 0);
  m.queueRetries.inc({ name: QUEUE_NAME }, 0);
  for (const reason of ['error', 'stale', 'gone']) m.informerRestarts.inc({ reason }, 0);
  m.seededAfterBoot.inc({ datasource: 'disk' }, 0);
  for (const state of ['running', 'succeeded', 'bootstrapped', 'failed', 'not-reported'])
    m.provisioningVmis.set({ state }, 0);
  m.provisioningFailures.inc({ module: 'other' }, 0);
  for (const result of WEBHOOK_RESULTS) m.webhookRequests.inc({ result }, 0);
  for (const result of ANNOTATION_WRITE_RESULTS) m.vmiAnnotationWrites.inc({ result }, 0);
  for (const datasource of ['disk', 'nocloud-http']) m.seededAfterBoot.inc({ datasource }, 0);
  return {
    ...m,
    // The agent hands in its probes once it has a queue and a source.
    setLiveProbes(probes: LiveProbes): void {
      Object.assign(live, probes);
    },
  };
}

/**
 * The agent's metrics (createMetrics), with setLiveProbes() for the gauges read
 * at scrape time.
 */
export type Metrics = ReturnType<typeof createMetrics>;
