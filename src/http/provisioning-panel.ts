// What the guest's cloud-init reported, on the status page: a node-wide
// count, one line per VMI in the list, and the VMI page's timeline (VMI
// seen -> seed written -> attached -> read by guest -> each stage and its
// modules -> done or failed). Pure; every string goes through esc(): the
// step names and descriptions come from the guest.
import type { ProvisioningStage, ProvisioningStatus, ProvisioningStep, VmiStatusRecord } from '../status/snapshot.ts';
import { formatSeconds, formatTime } from '../core/format.ts';
import { esc } from './html.ts';
import { defined, num, str } from './projection.ts';

export const PROVISIONING_STATES: ReadonlyArray<ProvisioningStatus['state']> = [
  'running',
  'failed',
  'succeeded',
  'bootstrapped',
  'not-reported',
];
const RESULTS = new Set(['SUCCESS', 'WARN', 'FAIL']);

function projectStep(s: ProvisioningStep): ProvisioningStep {
  return defined({
    name: String(s.name),
    startedAt: str(s.startedAt),
    finishedAt: str(s.finishedAt),
    seconds: num(s.seconds),
    result: RESULTS.has(s.result as string) ? s.result : undefined,
    description: str(s.description),
  });
}

// Field by field, like the rest of the snapshot's projection.
export function projectProvisioning(p: ProvisioningStatus): ProvisioningStatus {
  return defined({
    state: PROVISIONING_STATES.includes(p.state) ? p.state : 'running',
    boot: Number(p.boot),
    seenAt: str(p.seenAt),
    firstEventAt: str(p.firstEventAt),
    lastEventAt: str(p.lastEventAt),
    finishedAt: str(p.finishedAt),
    seconds: num(p.seconds),
    result: RESULTS.has(p.result as string) ? p.result : undefined,
    stages: (p.stages ?? []).map((s): ProvisioningStage => ({
      ...projectStep(s),
      modules: (s.modules ?? []).map(projectStep),
    })),
    failure: p.failure ? defined({ step: String(p.failure.step), description: str(p.failure.description) }) : undefined,
    droppedSteps: num(p.droppedSteps),
    reason: str(p.reason),
    sentinel: p.sentinel === 'written' || p.sentinel === 'unverified' ? p.sentinel : undefined,
  });
}

export function provisioningCounts(vmis: readonly VmiStatusRecord[]): Record<ProvisioningStatus['state'], number> {
  const counts = Object.fromEntries(PROVISIONING_STATES.map((s) => [s, 0])) as Record<
    ProvisioningStatus['state'],
    number
  >;
  for (const v of vmis) if (v.provisioning) counts[v.provisioning.state]++;
  return counts;
}

const BADGE: Record<ProvisioningStatus['state'], string> = {
  running: 'b-warn',
  failed: 'b-bad',
  succeeded: 'b-ok',
  bootstrapped: 'b-ok',
  'not-reported': 'b-warn',
};

// Only once some VMI has something to show (nothing is reported where the
// datasource listener is off).
export function provisioningPanel(vmis: readonly VmiStatusRecord[]): string {
  if (!vmis.some((v) => v.provisioning)) return '';
  const counts = provisioningCounts(vmis);
  const items = PROVISIONING_STATES.map(
    (s) =>
      `<tr data-provisioning="${esc(s)}"><th>${esc(s === 'running' ? 'provisioning now' : s === 'succeeded' ? 'done' : s)}</th><td class="num">${esc(counts[s])}</td></tr>`,
  ).join('');
  return `<section class="panel" id="provisioning"><h2>Provisioning <span class="muted">(cloud-init's reports)</span></h2><table class="kv">${items}</table></section>`;
}

// The list's short form.
export function provisioningLine(v: VmiStatusRecord): string {
  const p = v.provisioning;
  if (!p) return '';
  const what =
    p.state === 'failed'
      ? `provisioning failed: ${p.failure?.step ?? ''}`
      : p.state === 'succeeded' || p.state === 'bootstrapped'
        ? `${p.state === 'bootstrapped' ? 'bootstrapped' : 'provisioned'} in ${formatSeconds(p.seconds)}`
        : p.state === 'running'
          ? `provisioning (${lastStage(p)})`
          : 'progress not reported';
  return `<br><span class="badge ${BADGE[p.state]}" data-provisioning="${esc(p.state)}"${p.reason ? ` title="${esc(p.reason)}"` : ''}>${esc(what)}</span>`;
}

// The Cluster API sentinel, when the user-data writes it.
function sentinelNote(s: ProvisioningStatus['sentinel']): string {
  if (s === 'written') return ' <span class="muted">bootstrapped: Cluster API sentinel written</span>';
  if (s === 'unverified')
    return ' <span class="muted">Cluster API sentinel unverified: the user-data does not write it as runcmd\'s last command, or this boot did not run it</span>';
  return '';
}

function lastStage(p: ProvisioningStatus): string {
  const s = p.stages.at(-1);
  return s ? s.name : 'started';
}

function resultBadge(r: string | undefined): string {
  if (r === undefined) return '<span class="muted">running</span>';
  return `<span class="badge ${r === 'FAIL' ? 'b-bad' : r === 'WARN' ? 'b-warn' : 'b-ok'}">${esc(r)}</span>`;
}

function stepRow(s: ProvisioningStep, indent: boolean): string {
  const when = s.finishedAt ?? s.startedAt;
  return `<tr class="${indent ? 'step' : 'stage'}"><th>${indent ? '&nbsp;&nbsp;' : ''}<span class="mono">${esc(s.name)}</span></th><td>${resultBadge(s.result)} ${esc(formatSeconds(s.seconds))}${when ? ` <span class="muted">${esc(formatTime(when))}</span>` : ''}${s.description ? `<br><span class="muted">${esc(s.description)}</span>` : ''}</td></tr>`;
}

// Seconds from one ISO time to the next known one, for the timeline.
function gap(from: string | undefined, to: string | undefined): string {
  if (from === undefined || to === undefined) return '';
  const s = (Date.parse(to) - Date.parse(from)) / 1000;
  return Number.isFinite(s) ? ` <span class="muted">(+${esc(formatSeconds(Math.max(0, s)))})</span>` : '';
}

export function provisioningTimeline(v: VmiStatusRecord): string {
  const p = v.provisioning;
  if (!p) return '';
  const read = v.firstBoot?.seedReadAt ?? v.firstFetch?.['meta-data'];
  const marks: Array<[string, string | undefined]> = [
    ['VMI seen', p.seenAt],
    ['seed written', v.generatedAt],
    ['attached', v.firstBoot?.attachedAt],
    ['read by guest', read],
  ];
  let prev: string | undefined;
  const rows = marks
    .filter(([, at]) => at !== undefined)
    .map(([what, at]) => {
      const row = `<tr><th>${esc(what)}</th><td>${esc(formatTime(at))}${gap(prev, at)}</td></tr>`;
      prev = at;
      return row;
    });
  for (const s of p.stages) {
    rows.push(stepRow(s, false));
    for (const m of s.modules) rows.push(stepRow(m, true));
  }
  const end =
    p.state === 'failed'
      ? `<span class="badge b-bad">failed</span> <span class="mono">${esc(p.failure?.step ?? '')}</span>${p.failure?.description ? ` <span class="muted">${esc(p.failure.description)}</span>` : ''}`
      : p.state === 'succeeded' || p.state === 'bootstrapped'
        ? `<span class="badge b-ok">done</span> ${esc(formatSeconds(p.seconds))}${sentinelNote(p.sentinel)}`
        : p.state === 'running'
          ? '<span class="muted">not finished</span>'
          : `<span class="badge b-warn">progress not reported</span> <span class="muted">${esc(p.reason ?? '')}</span>`;
  rows.push(`<tr><th>${esc(p.state === 'not-reported' ? 'cloud-init' : 'done')}</th><td>${end}</td></tr>`);
  const boot = p.boot > 1 ? ` <span class="muted">boot ${esc(p.boot)}</span>` : '';
  const dropped = p.droppedSteps ? `<div class="muted">${esc(p.droppedSteps)} more steps not kept</div>` : '';
  return `<section class="panel" id="provisioning-timeline" data-provisioning="${esc(p.state)}"><h2>Provisioning${boot}</h2><table class="kv">${rows.join('')}</table>${dropped}</section>`;
}
