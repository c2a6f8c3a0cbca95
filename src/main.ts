#!/usr/bin/env node
// vmseed command line: `vmseed agent`, `vmseed cluster`, `vmseed build`, `vmseed inspect`, ...
// Commands are loaded on demand so `vmseed build` does not pay for the
// Kubernetes client.
import type { Command, CliContext, ExitCode } from './commands/cli.ts';
import { installSchemaFiles } from './cloudinit/schema/schema-store.ts';
import { readTextFileBounded } from './core/bounded-file.ts';

// cloud-init's schema files, for every command that checks cloud-config.
installSchemaFiles({ read: readTextFileBounded });

const COMMANDS: Record<string, { summary: string; load: () => Promise<Command> }> = {
  agent: {
    summary: 'keep seed images for the VMIs of this node (or of --local DIR)',
    load: async () => (await import('./commands/agent/agent-command.ts')).agent,
  },
  cluster: {
    summary: 'the cluster component (a Deployment off the VM nodes): the admission webhook',
    load: async () => (await import('./commands/cluster/cluster-command.ts')).cluster,
  },
  build: {
    summary: 'write a NoCloud or ConfigDrive seed image from files',
    load: async () => (await import('./commands/build.ts')).build,
  },
  lint: {
    summary: "check user-data, vendor-data or network-config against cloud-init's schemas",
    load: async () => (await import('./commands/lint.ts')).lint,
  },
  inspect: {
    summary: 'show the label, datasource and files of a seed image',
    load: async () => (await import('./commands/inspect.ts')).inspect,
  },
  redirect: {
    summary: 'keep the 169.254.169.254 DNAT to the datasource (host network, CAP_NET_ADMIN)',
    load: async () => (await import('./commands/redirect.ts')).redirect,
  },
  'seed-url': {
    summary: "print the DMI serial (ds=nocloud;s=...) for a VMI's seed over HTTP",
    load: async () => (await import('./commands/seed-url.ts')).seedUrl,
  },
  'warm-cache': {
    summary: "fill Node's compile cache so the agent starts without the TypeScript stripper (image builds)",
    load: async () => (await import('./commands/warm-cache.ts')).warmCache,
  },
};

function usage(): string {
  const lines = Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(10)} ${c.summary}`);
  return `usage: vmseed <command> [options]\n\ncommands:\n${lines.join('\n')}\n\nRun 'vmseed <command> --help' for a command's options, 'vmseed --version' for the version.\n`;
}

export async function main(argv: string[], base: Omit<CliContext, 'argv'>): Promise<ExitCode> {
  const [name, ...rest] = argv;
  if (name === '--version' || name === '-V' || name === 'version') {
    base.stdout.write((await import('./core/version.ts')).versionLine());
    return 0;
  }
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    base.stdout.write(usage());
    return name === undefined ? 2 : 0;
  }
  const entry = COMMANDS[name];
  if (!entry) {
    base.stderr.write(`vmseed: unknown command '${name}'\n${usage()}`);
    return 2;
  }
  const command = await entry.load();
  return command({ ...base, argv: rest });
}

// After a command returns, the loop should empty at once; what still holds
// it then is work the command gave up on (its stop deadline passed).
const EXIT_GRACE_MS = 1000;

if (import.meta.main) {
  const { forceExit, processExitDeps } = await import('./commands/process-exit.ts');
  const controller = new AbortController();
  for (const sig of ['SIGTERM', 'SIGINT'] as const) {
    process.on(sig, () => {
      // A second signal: the operator does not want to wait for the deadline.
      if (controller.signal.aborted) forceExit(1, `second ${sig} during shutdown`, processExitDeps());
      else controller.abort(new Error(sig));
    });
  }
  const code = await main(process.argv.slice(2), {
    stdout: process.stdout,
    stderr: process.stderr,
    stdin: process.stdin,
    env: process.env,
    cwd: process.cwd(),
    stopSignal: controller.signal,
  });
  process.exitCode = code;
  setTimeout(
    () => forceExit(code, `still running ${EXIT_GRACE_MS} ms after the command returned`, processExitDeps()),
    EXIT_GRACE_MS,
  ).unref();
}
