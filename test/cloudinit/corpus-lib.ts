// Shared by the corpus tests: load a case directory, render it, and run
// cloud-init's own parsers over many seeds in one Python process.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { VmseedError } from '../../src/errors.ts';
import { mergeManifests, parseManifests } from '../../src/agent/local/manifests.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import {
  DEFAULT_RENDER_OPTIONS,
  renderSeed,
  type RenderContext,
  type RenderOptions,
  type RenderOutcome,
} from '../../src/cloudinit/render.ts';

export const CORPUS_DIR = fileURLToPath(new URL('../fixtures/seeds/', import.meta.url));
const ORACLE = fileURLToPath(new URL('./oracle.py', import.meta.url));

export function caseNames(): string[] {
  return readdirSync(CORPUS_DIR)
    .filter((n) => statSync(join(CORPUS_DIR, n)).isDirectory())
    .sort();
}

export type CaseResult = { outcome: RenderOutcome } | { error: VmseedError };

export async function runCase(name: string, context?: RenderContext): Promise<CaseResult> {
  const dir = join(CORPUS_DIR, name);
  const optionsFile = join(dir, 'options.json');
  const options: RenderOptions = {
    ...DEFAULT_RENDER_OPTIONS,
    ...(existsSync(optionsFile) ? (JSON.parse(readFileSync(optionsFile, 'utf8')) as Partial<RenderOptions>) : {}),
  };
  try {
    const parts = readdirSync(dir)
      .filter((f) => f.endsWith('.yaml'))
      .sort()
      .map((f) => parseManifests(readFileSync(join(dir, f), 'utf8'), f));
    const objects = mergeManifests(parts);
    if (objects.vmis.length !== 1)
      throw new Error(`case ${name}: expected exactly one VMI, found ${objects.vmis.length}`);
    const outcome = await renderSeed(objects.vmis[0], new MemoryResolver(objects), options, context);
    return { outcome };
  } catch (e) {
    if (e instanceof VmseedError) return { error: e };
    throw e;
  }
}

// All files under dir, as relative path → bytes.
export function readTree(dir: string): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out.set(relative(dir, p).split('\\').join('/'), readFileSync(p));
    }
  };
  if (existsSync(dir)) walk(dir);
  return out;
}

export interface OracleRequest {
  cloudConfigs?: Array<{ id: string; text: string }>;
  mimes?: Array<{ id: string; text: string }>;
  networkConfigs?: Array<{ id: string; text: string }>;
  noCloudDirs?: Array<{ id: string; dir: string }>;
  configDrives?: Array<{ id: string; dir: string }>;
  networkRenders?: Array<{ id: string; format: 'yaml' | 'network_data'; text: string }>;
  passwords?: Array<{ id: string; password: string; hash: string }>;
}

export interface OracleItem {
  id: string;
  ok: boolean;
  error?: string;
  instanceId?: string;
  hostname?: string;
  publicKeys?: Record<string, string> | null;
  userdata?: string;
  networkdata?: unknown;
  version?: number;
  hasNetworkConfig?: boolean;
  count?: number;
  sshKeys?: string[];
  interfaces?: string[] | null;
  vendordata?: string | null;
  state?: NetworkStateSummary;
  eni?: string;
  netplan?: string;
}

export interface NetworkStateSummary {
  interfaces: Array<{
    name: string;
    mac: string | null;
    mtu: number | null;
    type: string;
    'accept-ra'?: boolean | null;
    subnets: Array<{
      type: string;
      address: string | null;
      prefix: number | null;
      gateway: string | null;
      dns_nameservers: string[];
      dns_search: string[];
      routes: Array<{ network: string; prefix: number; gateway: string }>;
    }>;
  }>;
  dns: { nameservers: string[]; search: string[] };
}

export interface OracleResponse {
  cloudConfigs: OracleItem[];
  mimes: OracleItem[];
  networkConfigs: OracleItem[];
  noCloudDirs: OracleItem[];
  configDrives: OracleItem[];
  networkRenders: OracleItem[];
  passwords: OracleItem[];
}

export function runOracle(req: OracleRequest): OracleResponse {
  const r = spawnSync('/usr/bin/python3', [ORACLE], {
    input: JSON.stringify(req),
    encoding: 'utf8',
    maxBuffer: 64 << 20,
  });
  if (r.status !== 0) throw new Error(`oracle.py failed (${r.status}): ${r.stderr}`);
  return JSON.parse(r.stdout) as OracleResponse;
}
