// Runs a Dockerfile's steps on the host, each stage into its own directory
// tree standing in for the image's root filesystem. Steps that change the
// host system (apt-get, useradd) are not run but recorded, so the test can
// check the host has what the image would install. A step this runner does
// not know fails loudly: the Dockerfile and its test cannot drift apart.
import { execFileSync } from 'node:child_process';
import { cpSync, mkdirSync, symlinkSync, readFileSync, statSync } from 'node:fs';
import { basename, dirname, join, posix } from 'node:path';
import { execForm, parseDockerfile, shellCommands, stagesOf } from './dockerfile.ts';

export interface ImageTree {
  root: string; // the final stage's root directory
  workdir: string; // image path
  entrypoint: string[];
  user: string;
  aptPackages: string[];
  accounts: { kind: 'group' | 'user'; name: string; id: number }[];
  exposed: string[];
  binDirs: string[]; // host paths standing for the image's /usr/local/bin and /usr/bin
}

export interface RunOptions {
  dockerfile: string; // path
  context: string; // build context directory
  out: string; // empty directory for the stage trees
  env: NodeJS.ProcessEnv; // for RUN npm …: PATH with Node 24 first
}

function words(cmd: string): string[] {
  return cmd.split(/\s+/).filter((w) => w !== '');
}

export function runDockerfile(options: RunOptions): ImageTree {
  const stages = stagesOf(parseDockerfile(readFileSync(options.dockerfile, 'utf8')));
  const roots = new Map<string, string>();
  let result: ImageTree | undefined;
  for (const stage of stages) {
    const root = join(options.out, `stage-${stage.index}`);
    mkdirSync(root, { recursive: true });
    if (stage.name) roots.set(stage.name, root);
    const tree: ImageTree = {
      root,
      workdir: '/',
      entrypoint: [],
      user: 'root',
      aptPackages: [],
      accounts: [],
      exposed: [],
      binDirs: [join(root, 'usr/local/bin'), join(root, 'usr/bin')],
    };
    const inTree = (p: string) => join(root, posix.resolve(tree.workdir, p));
    for (const ins of stage.instructions) {
      switch (ins.keyword) {
        case 'WORKDIR':
          tree.workdir = posix.resolve(tree.workdir, ins.args);
          mkdirSync(join(root, tree.workdir), { recursive: true });
          break;
        case 'COPY': {
          const parts = execForm(ins.args) ?? words(ins.args);
          const dest = parts.pop()!;
          const fromRoot = ins.flags.from === undefined ? options.context : roots.get(ins.flags.from);
          if (fromRoot === undefined) throw new Error(`line ${ins.line}: unknown stage ${ins.flags.from}`);
          const destIsDir = dest.endsWith('/') || parts.length > 1;
          for (const src of parts) {
            const from = join(fromRoot, src);
            const isDir = statSync(from).isDirectory();
            // Docker copies a directory's contents, a file into dest/ or as dest.
            const to = isDir || !destIsDir ? inTree(dest) : join(inTree(dest), basename(src));
            mkdirSync(isDir ? to : dirname(to), { recursive: true });
            cpSync(from, to, { recursive: true, verbatimSymlinks: true });
          }
          break;
        }
        case 'RUN':
          for (const cmd of shellCommands(ins.args)) runStep(cmd, tree, inTree, options, ins.line);
          break;
        case 'USER':
          tree.user = ins.args;
          break;
        case 'EXPOSE':
          tree.exposed.push(...words(ins.args));
          break;
        case 'ENTRYPOINT': {
          const argv = execForm(ins.args);
          if (argv === undefined) throw new Error(`line ${ins.line}: ENTRYPOINT must be exec form`);
          tree.entrypoint = argv;
          break;
        }
        case 'ENV':
        case 'LABEL':
        case 'ARG':
          throw new Error(
            `line ${ins.line}: ${ins.keyword} is not handled by this runner yet; teach test/support/dockerfile-run.ts`,
          );
        default:
          throw new Error(`line ${ins.line}: unexpected ${ins.keyword}`);
      }
    }
    result = tree;
  }
  if (result === undefined) throw new Error('no stage');
  return result;
}

function runStep(cmd: string, tree: ImageTree, inTree: (p: string) => string, options: RunOptions, line: number): void {
  const w = words(cmd);
  if (w[0] === 'npm') {
    execFileSync('sh', ['-c', cmd], { cwd: join(tree.root, tree.workdir), env: options.env, stdio: 'pipe' });
  } else if (w[0] === 'apt-get' && w[1] === 'update') {
    // Package indexes: the host's are used.
  } else if (w[0] === 'apt-get' && w.includes('install')) {
    tree.aptPackages.push(...w.slice(w.indexOf('install') + 1).filter((x) => !x.startsWith('-')));
  } else if (cmd === 'rm -rf /var/lib/apt/lists/*') {
    // Cleans the image layer; nothing to do in a tree that never had lists.
  } else if (w[0] === 'ln' && w[1] === '-s' && w.length === 4) {
    const link = inTree(w[3]);
    mkdirSync(dirname(link), { recursive: true });
    // Absolute targets point into the tree, as they would inside the image.
    symlinkSync(w[2].startsWith('/') ? join(tree.root, w[2]) : w[2], link);
  } else if (w[0] === 'vmseed') {
    // The image's own command, through the tree's /usr/local/bin/vmseed link
    // and the Node on the runner's PATH. Every step runs as the host user
    // here, USER or not (Node keys its compile cache by uid: the tests run
    // the tree as that same user).
    execFileSync('sh', ['-c', cmd], {
      cwd: join(tree.root, tree.workdir),
      env: { ...options.env, PATH: [...tree.binDirs, options.env.PATH].join(':') },
      stdio: 'pipe',
    });
  } else if (w[0] === 'chown' && w.length === 3) {
    // Ownership is the image's business; the tree keeps the host user's.
    statSync(inTree(w[2]));
  } else if (w[0] === 'groupadd' || w[0] === 'useradd') {
    const idFlag = w[0] === 'groupadd' ? '--gid' : '--uid';
    const id = Number(w[w.indexOf(idFlag) + 1]);
    tree.accounts.push({ kind: w[0] === 'groupadd' ? 'group' : 'user', name: w[w.length - 1], id });
  } else {
    throw new Error(`line ${line}: no host equivalent for step '${cmd}'; teach test/support/dockerfile-run.ts`);
  }
}
