// /healthz: is the process alive and its event loop turning? A timer beats
// every intervalMs and measures how late it fired; a late beat means the
// loop was blocked that long. The agent is unhealthy while a block beyond
// thresholdMs happened within the last windowMs (so a liveness probe that
// arrives just after a long block still sees it), or when no beat has
// happened for longer than the threshold (the loop is blocked right now,
// as seen by a caller that is itself on another path, e.g. a test clock).

export interface Clock {
  now(): number; // milliseconds, monotonic
}

export interface HealthOptions {
  intervalMs?: number;
  thresholdMs?: number;
  windowMs?: number;
  clock?: Clock;
}

export interface HealthReport {
  healthy: boolean;
  reasons: string[];
  lastBeatAgoMs: number;
  maxLagMs: number; // worst lag within the window
}

export interface EventLoopMonitor {
  // Records one beat; the timer calls it, tests may call it directly.
  beat(): void;
  report(): HealthReport;
  stop(): void;
}

const monotonic: Clock = { now: () => performance.now() };

export function createEventLoopMonitor(options: HealthOptions = {}): EventLoopMonitor {
  const intervalMs = options.intervalMs ?? 250;
  const thresholdMs = options.thresholdMs ?? 2000;
  const windowMs = options.windowMs ?? 30_000;
  const clock = options.clock ?? monotonic;
  let lastBeat = clock.now();
  // Lags beyond the threshold, with when they ended; pruned to the window.
  let blocks: Array<{ at: number; lagMs: number }> = [];
  let maxLagAt = { at: lastBeat, lagMs: 0 };

  const beat = () => {
    const now = clock.now();
    const lag = Math.max(0, now - lastBeat - intervalMs);
    lastBeat = now;
    if (lag > thresholdMs) blocks.push({ at: now, lagMs: lag });
    if (lag >= maxLagAt.lagMs || now - maxLagAt.at > windowMs) maxLagAt = { at: now, lagMs: lag };
  };

  const timer = options.clock ? undefined : setInterval(beat, intervalMs);
  // A health monitor must never keep the process alive on its own.
  timer?.unref();

  return {
    beat,
    report() {
      const now = clock.now();
      blocks = blocks.filter((b) => now - b.at <= windowMs);
      const reasons: string[] = [];
      const sinceBeat = now - lastBeat;
      if (sinceBeat > intervalMs + thresholdMs) {
        reasons.push(`event loop heartbeat missing for ${Math.round(sinceBeat)} ms (threshold ${thresholdMs} ms)`);
      }
      for (const b of blocks) {
        reasons.push(
          `event loop blocked for ${Math.round(b.lagMs)} ms ${Math.round((now - b.at) / 1000)} s ago (threshold ${thresholdMs} ms)`,
        );
      }
      const maxLag = Math.max(0, ...blocks.map((b) => b.lagMs), now - maxLagAt.at <= windowMs ? maxLagAt.lagMs : 0);
      return {
        healthy: reasons.length === 0,
        reasons,
        lastBeatAgoMs: Math.round(sinceBeat),
        maxLagMs: Math.round(maxLag),
      };
    },
    stop() {
      if (timer) clearInterval(timer);
    },
  };
}
