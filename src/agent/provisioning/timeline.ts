// A VMI's current boot as its guest's cloud-init reported it: each stage
// (init-local, init-network, modules-config, modules-final) and each step
// under it (config-runcmd, check-cache, ...), with start, finish and result.
// Pure: events in, facts out; the caller owns the clock.
//
// cloud-init names an event `<stage>` or `<stage>/<step>` (events.py
// ReportEventStack: the parent's full name, `/`, its own). It reports only
// once its reporting configuration is loaded, so a first boot's timeline
// may start in the middle of init-network; a step may come without its
// stage's start. A new boot begins when a stage starts or finishes a
// second time, or init-local starts after anything else: never mixed with
// the last one.
import type { ReportedEvent, ReportedResult } from '../../datasource/reports/event.ts';

export const FINAL_STAGE = 'modules-final';
// Per boot: stages and steps kept; more are counted, not kept.
export const MAX_STAGES = 8;
export const MAX_STEPS = 160;

export interface StepFacts {
  name: string;
  // Epoch ms, this agent's clock, when each event arrived.
  startedAt?: number;
  finishedAt?: number;
  // cloud-init's timestamps (guest clock, seconds).
  startTs?: number;
  finishTs?: number;
  result?: ReportedResult;
  description?: string;
}

export interface StageFacts extends StepFacts {
  steps: StepFacts[];
}

/**
 * A VMI's current boot as its guest's cloud-init reported it (object `uid`;
 * times in epoch ms on this agent's clock); stages and steps past the caps are
 * counted in `dropped`.
 */
export interface ProvisioningFacts {
  uid: string;
  boot: number;
  firstEventAt: number;
  lastEventAt: number;
  stages: StageFacts[];
  stepCount: number;
  dropped: number;
  result?: ReportedResult;
  failure?: { step: string; description: string };
  // modules-final finished: the boot is done.
  finishedAt?: number;
}

export interface Applied {
  facts: ProvisioningFacts;
  newBoot: boolean;
  // This event finished the boot (modules-final's finish).
  finished: boolean;
}

const RANK: Record<ReportedResult, number> = { SUCCESS: 0, WARN: 1, FAIL: 2 };

export function worse(a: ReportedResult | undefined, b: ReportedResult | undefined): ReportedResult | undefined {
  if (a === undefined) return b;
  if (b === undefined) return a;
  return RANK[b] > RANK[a] ? b : a;
}

function splitName(name: string): { stage: string; step: string } {
  const i = name.indexOf('/');
  return i < 0 ? { stage: name, step: '' } : { stage: name.slice(0, i), step: name.slice(i + 1) };
}

function startsNewBoot(f: ProvisioningFacts, stage: string, step: string, type: 'start' | 'finish'): boolean {
  if (step !== '') return false;
  const had = f.stages.find((s) => s.name === stage);
  if (type === 'start') return (stage === 'init-local' && f.stages.length > 0) || had?.startedAt !== undefined;
  return had?.finishedAt !== undefined;
}

function emptyBoot(uid: string, boot: number, at: number): ProvisioningFacts {
  return { uid, boot, firstEventAt: at, lastEventAt: at, stages: [], stepCount: 0, dropped: 0 };
}

// `prev` is changed in place unless a new boot begins.
export function applyEvent(prev: ProvisioningFacts | undefined, uid: string, e: ReportedEvent, at: number): Applied {
  const { stage, step } = splitName(e.name);
  let facts = prev?.uid === uid ? prev : undefined;
  let newBoot = false;
  if (!facts || startsNewBoot(facts, stage, step, e.type)) {
    facts = emptyBoot(uid, (facts?.boot ?? 0) + 1, at);
    newBoot = true;
  }
  facts.lastEventAt = at;
  const target = stepOf(facts, stage, step);
  if (!target) {
    facts.dropped++;
    return { facts, newBoot, finished: false };
  }
  if (e.type === 'start') {
    target.startedAt = at;
    target.startTs = e.timestamp;
    if (e.description) target.description = e.description;
    return { facts, newBoot, finished: false };
  }
  target.finishedAt = at;
  target.finishTs = e.timestamp;
  target.result = e.result;
  if (e.description) target.description = e.description;
  facts.result = worse(facts.result, e.result);
  if (e.result === 'FAIL' && !facts.failure) facts.failure = { step: e.name, description: e.description };
  const finished = step === '' && stage === FINAL_STAGE && facts.finishedAt === undefined;
  if (finished) facts.finishedAt = at;
  return { facts, newBoot, finished };
}

// The stage (step '') or step the event is about, made when new; undefined
// over the bounds.
function stepOf(f: ProvisioningFacts, stage: string, step: string): StepFacts | undefined {
  let s = f.stages.find((x) => x.name === stage);
  if (!s) {
    if (f.stages.length >= MAX_STAGES) return undefined;
    s = { name: stage, steps: [] };
    f.stages.push(s);
  }
  if (step === '') return s;
  let m = s.steps.find((x) => x.name === step);
  if (!m) {
    if (f.stepCount >= MAX_STEPS) return undefined;
    m = { name: step };
    s.steps.push(m);
    f.stepCount++;
  }
  return m;
}

// cloud-init's config modules (cloudinit/config/cc_*.py in 22.4 and 25.1),
// the label values of the failure counter; anything else is `other`.
const MODULES = new Set(
  (
    'ansible apk_configure apt_configure apt_pipelining bootcmd byobu ca_certs chef disable_ec2_metadata ' +
    'disk_setup fan final_message growpart grub_dpkg install_hotplug keyboard keys_to_console landscape locale ' +
    'lxd mcollective migrator mounts ntp package_update_upgrade_install phone_home power_state_change puppet ' +
    'refresh_rmc_and_interface reset_rmc resizefs resolv_conf rh_subscription rightscale_userdata rsyslog runcmd ' +
    'salt_minion scripts_per_boot scripts_per_instance scripts_per_once scripts_user scripts_vendor seed_random ' +
    'set_hostname set_passwords snap spacewalk ssh ssh_authkey_fingerprints ssh_import_id timezone ' +
    'ubuntu_advantage ubuntu_autoinstall ubuntu_drivers ubuntu_pro update_etc_hosts update_hostname users_groups ' +
    'wireguard write_files write_files_deferred yum_add_repo zypper_add_repo'
  ).split(' '),
);

// `modules-final/config-scripts-user` (22.4) or `.../config-scripts_user`
// (25.1 spells modules as cloud.cfg does) -> scripts_user.
export function moduleLabel(step: string): string {
  const last = step.slice(step.lastIndexOf('/') + 1);
  if (!last.startsWith('config-')) return 'other';
  const name = last.slice('config-'.length).replace(/-/g, '_');
  return MODULES.has(name) ? name : 'other';
}
