// Event-loop lag that is lag. perf_hooks.monitorEventLoopDelay records the
// time between two ticks of its timer, i.e. the resolution plus the delay
// (Node's lib/internal/histogram.js / src/histogram.cc ELDHistogram record
// the full interval), and prom-client exports those values as they are, so an
// idle agent sampling every 100 ms showed ~0.1 s of "lag". These gauges
// subtract the resolution (never below 0); same names and help as
// prom-client's, so dashboards keep working and read real delays.
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Gauge, type Registry } from 'prom-client';

// prom-client's names (lib/metrics/eventLoopLag.js), without the prefix.
export const HISTOGRAM_LAG_METRICS = {
  min: ['nodejs_eventloop_lag_min_seconds', 'The minimum recorded event loop delay.'],
  max: ['nodejs_eventloop_lag_max_seconds', 'The maximum recorded event loop delay.'],
  mean: ['nodejs_eventloop_lag_mean_seconds', 'The mean of the recorded event loop delays.'],
  stddev: ['nodejs_eventloop_lag_stddev_seconds', 'The standard deviation of the recorded event loop delays.'],
  p50: ['nodejs_eventloop_lag_p50_seconds', 'The 50th percentile of the recorded event loop delays.'],
  p90: ['nodejs_eventloop_lag_p90_seconds', 'The 90th percentile of the recorded event loop delays.'],
  p99: ['nodejs_eventloop_lag_p99_seconds', 'The 99th percentile of the recorded event loop delays.'],
} as const;

export function registerEventLoopLag(registry: Registry, prefix: string, resolutionMs: number): void {
  for (const [name] of Object.values(HISTOGRAM_LAG_METRICS)) registry.removeSingleMetric(prefix + name);
  const h = monitorEventLoopDelay({ resolution: resolutionMs });
  h.enable();
  const res = resolutionMs * 1e6;
  const lag = (ns: number) => (h.count === 0 ? 0 : Math.max(0, ns - res) / 1e9);
  const values = {
    min: () => lag(h.min),
    max: () => lag(h.max),
    mean: () => lag(h.mean),
    // A shift does not change the spread.
    stddev: () => (h.count === 0 ? 0 : h.stddev / 1e9),
    p50: () => lag(h.percentile(50)),
    p90: () => lag(h.percentile(90)),
    p99: () => lag(h.percentile(99)),
  };
  // One scrape reads all seven from the same window: the first gauge
  // (registered first, so collected first) takes the snapshot and starts a
  // new window, the others read that snapshot.
  const keys = Object.keys(HISTOGRAM_LAG_METRICS) as Array<keyof typeof values>;
  let snapshot: Record<keyof typeof values, number> = { min: 0, max: 0, mean: 0, stddev: 0, p50: 0, p90: 0, p99: 0 };
  keys.forEach((key, i) => {
    const [name, help] = HISTOGRAM_LAG_METRICS[key];
    const gauge: Gauge = new Gauge({
      name: prefix + name,
      help,
      registers: [registry],
      aggregator: key === 'min' ? 'min' : key === 'max' ? 'max' : 'average',
      collect() {
        if (i === 0) {
          snapshot = Object.fromEntries(keys.map((k) => [k, values[k]()])) as typeof snapshot;
          h.reset();
        }
        gauge.set(snapshot[key]);
      },
    });
  });
}
