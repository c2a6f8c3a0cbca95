// Keeps the 169.254.169.254 redirect in place: applies the ruleset at start,
// checks it every interval and re-applies it when it is gone or not ours
// (a `nft flush ruleset`, a firewall reload, a node agent that rebuilds
// tables), keeps its set of launcher pod addresses equal to what the agent
// says (checked every interval and when told the list changed), and
// removes it on a clean stop. nft is run through an injected
// runner, so tests drive it in a network namespace of their own.
import { spawn } from 'node:child_process';
import type { Logger } from 'pino';
import { VmseedError } from '../errors.ts';
import {
  launcherSetElements,
  renderLauncherSync,
  renderRemoval,
  renderRuleset,
  ruleInPlace,
  type RedirectSpec,
} from './nft-ruleset.ts';
import type { RedirectMetrics } from './redirect-metrics.ts';
import type { TargetVerdict } from './target-check.ts';

export interface NftResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface NftRunner {
  run(args: string[], stdin?: string): Promise<NftResult>;
}

/**
 * Runs nft as a child process, killed after `timeoutMs` (default 10 s); a
 * missing binary is exit 127. `prefix` runs nft through another program
 * (tests: `ip netns exec NS`).
 */
export function execNft(options: { binary?: string; prefix?: string[]; timeoutMs?: number } = {}): NftRunner {
  const binary = options.binary ?? 'nft';
  const prefix = options.prefix ?? [];
  const timeoutMs = options.timeoutMs ?? 10_000;
  return {
    run(args, stdin) {
      const argv = [...prefix, binary, ...args];
      return new Promise((resolve) => {
        const child = spawn(argv[0], argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'], timeout: timeoutMs });
        let stdout = '';
        let stderr = '';
        // Bounded: a ruleset listing of our one table is a few kilobytes.
        child.stdout.on('data', (c: Buffer) => {
          if (stdout.length < 1_000_000) stdout += c.toString('utf8');
        });
        child.stderr.on('data', (c: Buffer) => {
          if (stderr.length < 64_000) stderr += c.toString('utf8');
        });
        child.on('error', (e: NodeJS.ErrnoException) =>
          resolve({ code: e.code === 'ENOENT' ? 127 : 1, stdout, stderr: `${argv[0]}: ${e.message}` }),
        );
        child.on('close', (code, signal) => resolve({ code: code ?? (signal ? 128 : 1), stdout, stderr }));
        child.stdin.on('error', () => {});
        child.stdin.end(stdin ?? '');
      });
    },
  };
}

export type ApplyReason = 'start' | 'missing';

// not-checked: before the first check; missing: found gone and not yet
// re-applied; apply-failed: nft refused it; not-listed: loaded but not
// found after; stopped: removed on a clean stop. The rule in place but its
// target not this node's datasource: wrong-target, target-unreachable,
// target-unverified (target-check.ts).
export type RedirectMissingReason =
  | 'not-checked'
  | 'missing'
  | 'apply-failed'
  | 'not-listed'
  | 'stopped'
  | Exclude<TargetVerdict, { ok: true }>['reason'];

export interface RedirectKeeperOptions {
  spec: RedirectSpec;
  runner: NftRunner;
  logger: Logger;
  metrics?: RedirectMetrics;
  // How often the rule is checked (and re-applied when gone). Default 5 s.
  intervalMs?: number;
  // Whether the rule's target is this node's datasource, asked after every
  // check that found the rule; without it, the rule alone counts.
  verifyTarget?: () => Promise<TargetVerdict>;
  // This node's launcher pod addresses, the only sources redirected (unless
  // spec.allPods); read at every check. Absent: none (nothing redirected).
  launchers?: () => Promise<readonly string[]>;
}

/**
 * Keeps the DNAT ruleset in place: start() applies it and re-checks every
 * interval, re-applying when it is gone; stop() removes the table. inPlace and
 * reason are what /readyz answers.
 */
export class RedirectKeeper {
  readonly #o: RedirectKeeperOptions;
  readonly #log: Logger;
  // The rule as last listed, and the last verdict on its target (undefined:
  // not asked yet).
  #inPlace = false;
  #target: TargetVerdict | undefined;
  #lastError: string | undefined;
  #reason: RedirectMissingReason = 'not-checked';
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  #stopped = false;
  // The last `nft -j list table` output, for the set's elements.
  #listing = '';
  // Rounds run one at a time: the interval's and refresh()'s.
  #serial: Promise<void> = Promise.resolve();

  constructor(options: RedirectKeeperOptions) {
    this.#o = options;
    this.#log = options.logger.child({ component: 'redirect' });
  }

  // Whether the last check found our rule (and its target verified). What
  // /readyz answers.
  get inPlace(): boolean {
    return this.#inPlace && this.#targetOk();
  }

  get lastError(): string | undefined {
    if (!this.#inPlace || this.#targetOk()) return this.#lastError;
    return this.#target?.ok === false ? this.#target.message : 'its DNAT target has not been checked yet';
  }

  // Why the rule is not in place, as a stable code for /readyz's JSON.
  get reason(): RedirectMissingReason {
    if (!this.#inPlace || this.#targetOk()) return this.#reason;
    return this.#target?.ok === false ? this.#target.reason : 'not-checked';
  }

  #targetOk(): boolean {
    return this.#o.verifyTarget === undefined || this.#target?.ok === true;
  }

  async apply(reason: ApplyReason): Promise<void> {
    const r = await this.#o.runner.run(['-f', '-'], renderRuleset(this.#o.spec, await this.#launchers()));
    if (r.code !== 0) {
      this.#o.metrics?.errors.inc({ operation: 'apply' });
      throw new VmseedError(
        'REDIRECT_APPLY_FAILED',
        `nft could not load the redirect table ip ${this.#o.spec.table} (exit ${r.code}): ${r.stderr.trim().slice(0, 300)}; ` +
          'the container needs CAP_NET_ADMIN in the host network namespace (hostNetwork: true) and the nf_tables/nft_nat modules',
        { kind: 'retryable', field: 'redirect' },
      );
    }
    this.#o.metrics?.applies.inc({ reason });
    this.#log.info(
      { reason, table: this.#o.spec.table, to: `${this.#o.spec.to.host}:${this.#o.spec.to.port}` },
      'redirect applied',
    );
  }

  async check(): Promise<boolean> {
    const r = await this.#o.runner.run(['-j', 'list', 'table', 'ip', this.#o.spec.table]);
    // Exit non-zero: no such table.
    const ok = r.code === 0 && ruleInPlace(r.stdout, this.#o.spec);
    this.#listing = r.code === 0 ? r.stdout : '';
    this.#setInPlace(ok);
    if (!ok) this.#reason = 'missing';
    return ok;
  }

  async #launchers(): Promise<readonly string[]> {
    if (this.#o.spec.allPods === true || this.#o.launchers === undefined) return [];
    return this.#o.launchers();
  }

  // The set made equal to the launcher list, in one transaction, when the
  // last listing shows it differs.
  async #syncLaunchers(): Promise<void> {
    if (this.#o.spec.allPods === true) return;
    const want = [...new Set(await this.#launchers())].sort();
    const have = launcherSetElements(this.#listing, this.#o.spec) ?? [];
    if (want.length === have.length && want.every((a, i) => a === have[i])) return;
    const r = await this.#o.runner.run(['-f', '-'], renderLauncherSync(this.#o.spec, want));
    if (r.code !== 0) {
      this.#o.metrics?.errors.inc({ operation: 'launchers' });
      throw new VmseedError(
        'REDIRECT_APPLY_FAILED',
        `nft could not update the launcher set of table ip ${this.#o.spec.table} (exit ${r.code}): ${r.stderr.trim().slice(0, 300)}`,
        { kind: 'retryable', field: 'redirect' },
      );
    }
    this.#o.metrics?.applies.inc({ reason: 'launchers' });
    this.#log.info({ launchers: want.length, was: have.length }, 'redirect launcher set updated');
  }

  /** A round now (after the one running): the launcher list changed. */
  refresh(): Promise<void> {
    return this.tick('missing');
  }

  // One round: check, re-apply when the rule is not in place, and bring the
  // launcher set up to date.
  tick(reason: ApplyReason = 'missing'): Promise<void> {
    const run = this.#serial.then(() => this.#round(reason));
    this.#serial = run.catch(() => {});
    return run;
  }

  async #round(reason: ApplyReason): Promise<void> {
    if (this.#stopped) return;
    try {
      if (!(await this.check())) {
        if (reason === 'missing')
          this.#log.warn({ table: this.#o.spec.table }, 'redirect not in place (flushed or replaced); re-applying');
        await this.apply(reason);
        if (!(await this.check())) {
          this.#lastError = 'the redirect rule was loaded but is not listed';
          this.#reason = 'not-listed';
          return;
        }
      }
      await this.#syncLaunchers();
      this.#lastError = undefined;
      await this.#verifyTarget();
    } catch (e) {
      this.#setInPlace(false);
      this.#reason = 'apply-failed';
      this.#lastError = (e as Error).message;
      this.#log.error({ code: (e as VmseedError).code }, (e as Error).message);
    }
  }

  start(): Promise<void> {
    const first = this.tick('start');
    const loop = () => {
      this.#timer = setTimeout(() => {
        this.#running = this.tick('missing').finally(() => {
          if (!this.#stopped) loop();
        });
      }, this.#o.intervalMs ?? 5000);
    };
    this.#running = first.finally(() => {
      if (!this.#stopped) loop();
    });
    return first;
  }

  // Clean stop: no more checks, and the table is removed (a stopped keeper
  // must not leave traffic pointed at a listener nobody vouches for).
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    await this.#running?.catch(() => {});
    const r = await this.#o.runner.run(['-f', '-'], renderRemoval(this.#o.spec));
    this.#setInPlace(false);
    this.#reason = 'stopped';
    if (r.code !== 0) {
      this.#o.metrics?.errors.inc({ operation: 'remove' });
      throw new VmseedError(
        'REDIRECT_APPLY_FAILED',
        `nft could not remove table ip ${this.#o.spec.table} (exit ${r.code}): ${r.stderr.trim().slice(0, 300)}`,
        {
          kind: 'retryable',
          field: 'redirect',
        },
      );
    }
    this.#log.info({ table: this.#o.spec.table }, 'redirect removed');
  }

  async #verifyTarget(): Promise<void> {
    if (!this.#o.verifyTarget) return;
    const v = await this.#o.verifyTarget();
    const prev = this.#target;
    this.#target = v;
    if (!v.ok && (prev?.ok !== false || prev.reason !== v.reason)) this.#log.error({ reason: v.reason }, v.message);
    if (v.ok && prev?.ok === false) this.#log.info({}, 'redirect target verified: it is the datasource');
    this.#setInPlace(this.#inPlace);
  }

  #setInPlace(v: boolean): void {
    this.#inPlace = v;
    this.#o.metrics?.inPlace.set(this.inPlace ? 1 : 0);
  }
}
