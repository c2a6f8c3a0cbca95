// A Dockerfile parser (instructions, continuations, stages) and a linter with
// the hadolint rules that matter for this image: hadolint itself is not in
// Debian 12, and the npm package named after it ships no binary (it
// downloads one at run time, from outside the package registries).

export interface Instruction {
  keyword: string; // upper case: FROM, RUN, COPY, ...
  args: string; // the rest of the line, continuations joined
  flags: Record<string, string>; // --from=deps, --chown=...
  line: number; // 1-based line of the keyword
}

export interface Stage {
  index: number;
  name?: string;
  image: string;
  instructions: Instruction[]; // after FROM
}

export function parseDockerfile(text: string): Instruction[] {
  const out: Instruction[] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const trimmed = lines[i].trim();
    if (trimmed === '' || trimmed.startsWith('#')) continue;
    const start = i;
    let logical = trimmed;
    while (logical.endsWith('\\') && i + 1 < lines.length) {
      i++;
      const next = lines[i].trim();
      if (next.startsWith('#')) continue; // comments inside continuations are dropped
      logical = logical.slice(0, -1).trimEnd() + ' ' + next;
    }
    const m = /^(\S+)\s*(.*)$/.exec(logical)!;
    let args = m[2];
    const flags: Record<string, string> = {};
    for (let f = /^--([a-z-]+)=(\S+)\s+/.exec(args); f !== null; f = /^--([a-z-]+)=(\S+)\s+/.exec(args)) {
      flags[f[1]] = f[2];
      args = args.slice(f[0].length);
    }
    out.push({ keyword: m[1].toUpperCase(), args: args.trim(), flags, line: start + 1 });
  }
  return out;
}

export function stagesOf(instructions: Instruction[]): Stage[] {
  const stages: Stage[] = [];
  for (const ins of instructions) {
    if (ins.keyword === 'FROM') {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(ins.args);
      if (!m) throw new Error(`line ${ins.line}: cannot parse FROM ${ins.args}`);
      stages.push({ index: stages.length, name: m[2], image: m[1], instructions: [] });
    } else if (stages.length === 0) {
      if (ins.keyword !== 'ARG') throw new Error(`line ${ins.line}: ${ins.keyword} before FROM`);
    } else {
      stages[stages.length - 1].instructions.push(ins);
    }
  }
  return stages;
}

// Exec form (a JSON array of strings) or undefined for shell form.
export function execForm(args: string): string[] | undefined {
  if (!args.startsWith('[')) return undefined;
  try {
    const parsed = JSON.parse(args) as unknown;
    return Array.isArray(parsed) && parsed.every((a) => typeof a === 'string') ? parsed : undefined;
  } catch {
    return undefined;
  }
}

// `a && b && c` → ['a', 'b', 'c'] (the only shell composition the image uses).
export function shellCommands(run: string): string[] {
  return run
    .split('&&')
    .map((s) => s.trim())
    .filter((s) => s !== '');
}

export interface LintFinding {
  rule: string;
  line: number;
  message: string;
}

// hadolint rule ids where one exists (DLxxxx), our own otherwise.
export function lintDockerfile(text: string): LintFinding[] {
  const instructions = parseDockerfile(text);
  const stages = stagesOf(instructions);
  const findings: LintFinding[] = [];
  const add = (rule: string, line: number, message: string) => findings.push({ rule, line, message });
  const stageNames = new Set<string>();
  for (const stage of stages) {
    const from = instructions.find((i) => i.keyword === 'FROM' && i.args.startsWith(stage.image))!;
    const [imageRef, digest] = stage.image.split('@');
    const tag = imageRef.includes(':') ? imageRef.slice(imageRef.lastIndexOf(':') + 1) : undefined;
    if (!stageNames.has(imageRef)) {
      if (tag === undefined && digest === undefined) add('DL3006', from.line, `${stage.image}: tag the base image`);
      if (tag === 'latest') add('DL3007', from.line, `${stage.image}: do not use :latest`);
      if (tag !== undefined && digest === undefined && !/\d+\.\d+/.test(tag))
        add('VS001', from.line, `${stage.image}: pin at least major.minor`);
    }
    if (stage.name) stageNames.add(stage.name);
    for (const ins of stage.instructions) {
      if (ins.keyword === 'ADD') add('DL3020', ins.line, 'use COPY, not ADD, for local files');
      if (ins.keyword === 'MAINTAINER') add('DL4000', ins.line, 'MAINTAINER is deprecated');
      if (ins.keyword === 'WORKDIR' && !ins.args.startsWith('/')) add('DL3000', ins.line, 'WORKDIR must be absolute');
      if (ins.keyword === 'COPY' && ins.flags.from !== undefined && !stageNames.has(ins.flags.from)) {
        add('DL3022', ins.line, `COPY --from=${ins.flags.from} names no earlier stage`);
      }
      if (ins.keyword === 'RUN') {
        const commands = shellCommands(ins.args);
        const installs = commands.filter((c) => /^apt-get\s+(\S+\s+)*install\b/.test(c));
        for (const c of commands) {
          if (/^sudo\b/.test(c)) add('DL3004', ins.line, 'do not use sudo');
          if (/^cd\s/.test(c)) add('DL3003', ins.line, 'use WORKDIR, not cd');
          if (/^apt\s/.test(c)) add('DL3027', ins.line, 'use apt-get, not apt');
          if (/^apt-get\s+(\S+\s+)*upgrade\b/.test(c)) add('DL3005', ins.line, 'do not apt-get upgrade');
        }
        for (const c of installs) {
          if (!/\s(-y|--yes|--assume-yes)\b/.test(c)) add('DL3014', ins.line, 'apt-get install needs -y');
          if (!/\s--no-install-recommends\b/.test(c))
            add('DL3015', ins.line, 'apt-get install needs --no-install-recommends');
        }
        if (installs.length > 0) {
          if (!commands.some((c) => /^apt-get\s+update\b/.test(c)))
            add('DL3009', ins.line, 'apt-get update in the same RUN as install');
          if (!commands.some((c) => /^rm\s+-rf\s+\/var\/lib\/apt\/lists\/\*$/.test(c)))
            add('DL3009', ins.line, 'remove /var/lib/apt/lists/* in the same RUN');
        }
        if (commands.some((c) => /^npm\s+(install|i)\b/.test(c)))
          add('VS002', ins.line, 'use npm ci (lockfile), not npm install');
      }
      if (ins.keyword === 'ENTRYPOINT' || ins.keyword === 'CMD') {
        if (execForm(ins.args) === undefined) add('DL3025', ins.line, `${ins.keyword} must use the exec (JSON) form`);
      }
    }
  }
  const final = stages[stages.length - 1];
  if (final === undefined) {
    add('VS003', 1, 'no FROM');
    return findings;
  }
  const users = final.instructions.filter((i) => i.keyword === 'USER');
  const lastUser = users[users.length - 1];
  if (lastUser === undefined) add('DL3002', 1, 'the final stage must set USER');
  else if (/^(root|0)(:|$)/.test(lastUser.args)) add('DL3002', lastUser.line, 'the last USER must not be root');
  if (!final.instructions.some((i) => i.keyword === 'ENTRYPOINT'))
    add('VS004', 1, 'the final stage needs an ENTRYPOINT');
  return findings;
}
