// Local mode under random editors: the real file watcher on a temporary
// directory, the real agent (renderer, ISO builder, image store) and an
// injector that records every attach and detach. Each sequence edits one
// VMI's manifest the way some editor or tool does (write in place, rename
// over, delete and create, a ConfigMap volume's `..data` swap), in bursts
// or with pauses. After the last edit the image holds the last content, and
// no detach ever happened: the VMI existed all along.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { mkdir, rename, rm, symlink, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import fc from 'fast-check';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { RecordingInjector } from '../support/agent-harness.ts';
import { startLocalAgent, vmiManifest } from '../support/local-agent.ts';

// Shorter than the default (SETTLE_MS), so that hundreds of sequences run
// in a couple of minutes, but above chokidar's windows: it drops a change
// within 50 ms of the last one it emitted, and a removal within 100 ms, with
// no event after. With a shorter interval an edit right after a read went
// unseen, so two reads in two short absences (two delete-and-creates) looked
// like one long one and a VMI that exists was detached (seen on a loaded
// machine with 25 ms). A delete and create is far quicker than this.
const SETTLE_MS = 120;
const SEQUENCES = 100;

const manifest = (name: string, queue: number) =>
  vmiManifest(name, `write_files:\n  - path: /etc/worker.conf\n    content: queue=${queue}`);

type Editor = 'in-place' | 'rename-over' | 'delete-create' | 'data-swap';

// One manifest, laid out as the editor expects: a plain file, or a
// ConfigMap volume's (worker.yaml -> ..data/worker.yaml, ..data -> ..<n>).
class Manifest {
  readonly dir: string;
  readonly name: string;
  readonly configMap: boolean;
  #generation = 0;

  constructor(dir: string, name: string, configMap: boolean) {
    this.dir = dir;
    this.name = name;
    this.configMap = configMap;
  }

  get path(): string {
    return join(this.dir, 'worker.yaml');
  }

  async create(text: string): Promise<void> {
    await mkdir(this.dir);
    if (!this.configMap) return writeFile(this.path, text);
    await this.#timestamped(text);
    await symlink(`..${this.#generation}`, join(this.dir, '..data'));
    await symlink('..data/worker.yaml', this.path);
  }

  async edit(editor: Editor, text: string): Promise<void> {
    switch (editor) {
      case 'in-place':
        return writeFile(this.path, text);
      case 'rename-over':
        await writeFile(join(this.dir, '.worker.yaml.tmp'), text);
        return rename(join(this.dir, '.worker.yaml.tmp'), this.path);
      case 'delete-create':
        await unlink(this.path);
        return writeFile(this.path, text);
      case 'data-swap': {
        // The kubelet's order: new directory, new link, rename it over
        // ..data, remove the old directory.
        const old = this.#generation;
        await this.#timestamped(text);
        await symlink(`..${this.#generation}`, join(this.dir, '..data_tmp'));
        await rename(join(this.dir, '..data_tmp'), join(this.dir, '..data'));
        return rm(join(this.dir, `..${old}`), { recursive: true });
      }
    }
  }

  async #timestamped(text: string): Promise<void> {
    this.#generation++;
    await mkdir(join(this.dir, `..${this.#generation}`));
    await writeFile(join(this.dir, `..${this.#generation}`, 'worker.yaml'), text);
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until(what: string, fn: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(5);
  }
}

// The queue value in the image attached for `uid`, if it can be read now
// (an image is pruned once replaced).
function attachedQueue(injector: RecordingInjector, uid: string): number | undefined {
  const path = injector.attached.get(uid);
  if (!path) return undefined;
  try {
    const iso = readIso(readFileSync(path));
    const ud = Buffer.from(iso.read('/user-data') ?? new Uint8Array()).toString('utf8');
    const m = /queue=(\d+)/.exec(ud);
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

const plainEdit = fc.record({
  editor: fc.constantFrom<Editor>('in-place', 'rename-over', 'delete-create'),
  // Mostly bursts; sometimes long enough for the agent to apply an edit
  // in between.
  pauseMs: fc.constantFrom(0, 0, 0, 1, 5, SETTLE_MS * 2),
});
const swapEdit = fc.record({
  editor: fc.constant<Editor>('data-swap'),
  pauseMs: fc.constantFrom(0, 0, 0, 1, 5, SETTLE_MS * 2),
});
const sequence = fc.oneof(
  fc.record({ configMap: fc.constant(false), edits: fc.array(plainEdit, { minLength: 1, maxLength: 6 }) }),
  fc.record({ configMap: fc.constant(true), edits: fc.array(swapEdit, { minLength: 1, maxLength: 6 }) }),
);

type Sequence = { configMap: boolean; edits: { editor: Editor; pauseMs: number }[] };

test(
  `${SEQUENCES} random edit sequences, two at a time: the image follows the last edit, no detach`,
  { timeout: 300_000 },
  async (t) => {
    const injector = new RecordingInjector();
    const { agent, manifests, lines } = await startLocalAgent(t, { settleMs: SETTLE_MS, injector });

    let run = 0;
    let slowRuns = 0;
    // One sequence on a VMI of its own, its manifest in its own directory.
    const edit = async ({ configMap, edits }: Sequence) => {
      run++;
      const name = `w${run}`;
      const key = `default/${name}`;
      const file = new Manifest(join(manifests, `r${run}`), name, configMap);
      await file.create(manifest(name, 0));
      await until(`${key} seeded`, () => {
        const uid = agent.source.get(key)?.metadata.uid;
        return uid !== undefined && attachedQueue(injector, uid) === 0;
      });
      const uid = agent.source.get(key)!.metadata.uid!;
      // How long the file was away or empty at most: the time its slowest
      // delete and create or write in place took (a starved test process
      // stretches it). A rename is atomic.
      let slowest = 0;
      for (const [i, e] of edits.entries()) {
        const began = performance.now();
        await file.edit(e.editor, manifest(name, i + 1));
        if (e.editor === 'in-place' || e.editor === 'delete-create')
          slowest = Math.max(slowest, performance.now() - began);
        if (e.pauseMs) await sleep(e.pauseMs);
      }
      const last = edits.length;
      await until(`${key} holding queue=${last}`, () => attachedQueue(injector, uid) === last);
      // And it stays there: no late read of an older version.
      await sleep(SETTLE_MS * 2);
      assert.equal(attachedQueue(injector, uid), last);
      // Away for a settle interval is a deletion; shorter never is.
      if (slowest < SETTLE_MS) {
        assert.deepEqual(
          injector.actions('eject').filter((c) => c.key === key),
          [],
          'detached a VMI that exists',
        );
      } else slowRuns++;
    };
    await fc.assert(
      // Two sequences at once, on two VMIs: twice the sequences in the time
      // of one, and edits of one file land while another is being read.
      fc.asyncProperty(fc.tuple(sequence, sequence), async (pair) => {
        // Both finish before the next pair (or the report) starts.
        const failed = (await Promise.allSettled(pair.map(edit))).find((r) => r.status === 'rejected');
        if (failed) throw failed.reason;
      }),
      // The failing assertion itself in the report, not only the counterexample.
      { numRuns: SEQUENCES / 2, endOnFailure: true, includeErrorInReport: true },
    );
    t.diagnostic(`${slowRuns} of ${run} sequences had an edit as slow as the settle interval`);
    assert.ok(run >= SEQUENCES, `${run} sequences ran`);
    assert.ok(slowRuns < run, 'some sequences are checked for detaches');
    if (slowRuns === 0) assert.ok(!lines.some((l) => l.includes('seed image removed')), 'no image was removed');
  },
);
