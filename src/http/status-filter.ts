// The status page's filter box: one query matched against each VMI's name,
// namespace, state and codes. The server applies it when it renders (the
// page works without JavaScript); the page's one script applies the same
// functions as the user types. The script carries these functions' own
// source text, so the browser and the server cannot disagree on a match.
import { createHash } from 'node:crypto';
import type { VmiStatusRecord } from '../status/snapshot.ts';

/** The longest query the filter reads; the rest is dropped (the input's maxlength too). */
export const MAX_QUERY_LENGTH = 200;

/** What a query is matched against, for one VMI. */
export interface FilterFields {
  name: string;
  namespace: string;
  state: string;
  codes: string[];
}

// Self-contained (no imports, no outer names): the script embeds its source.
// Control characters become spaces; a surrogate pair cut in half at the cap
// is dropped rather than left as half a character.
function normalizeQueryText(raw: string, max: number): string {
  return raw
    .replace(/\p{Cc}+/gu, ' ')
    .slice(0, max)
    .replace(/[\uD800-\uDBFF]$/, '');
}

// Self-contained, as above. Every whitespace-separated term must match (case
// does not count): a bare term any of the fields, `name:`, `ns:` or
// `namespace:`, `state:` and `code:` that field only; a term with another
// prefix is matched whole, colon included.
function queryMatches(query: string, row: FilterFields): boolean {
  const scoped = new Map<string, string[]>([
    ['name', [row.name]],
    ['ns', [row.namespace]],
    ['namespace', [row.namespace]],
    ['state', [row.state]],
    ['code', row.codes],
  ]);
  const all = [row.name, row.namespace, row.state, ...row.codes];
  return query
    .toLowerCase()
    .split(/\s+/)
    .filter((term) => term !== '')
    .every((term) => {
      const colon = term.indexOf(':');
      const fields = colon > 0 ? scoped.get(term.slice(0, colon)) : undefined;
      const needle = fields ? term.slice(colon + 1) : term;
      return (fields ?? all).some((f) => f.toLowerCase().includes(needle));
    });
}

/**
 * The `q` query parameter as the filter reads it: plain text, at most
 * MAX_QUERY_LENGTH characters, control characters as spaces; '' when absent.
 */
export function parseQuery(value: string | null | undefined): string {
  return normalizeQueryText(String(value ?? ''), MAX_QUERY_LENGTH);
}

/** Whether a VMI's row is shown under the query (an empty query shows every row). */
export function matchesQuery(query: string, v: VmiStatusRecord): boolean {
  return queryMatches(query, filterFields(v));
}

/** The fields a query is matched against: the codes are those the row's problems cell shows. */
export function filterFields(v: VmiStatusRecord): FilterFields {
  const codes = [v.stale?.code, v.lastError?.code, ...v.warnings.map((w) => w.code)];
  return {
    name: v.name,
    namespace: v.namespace,
    state: v.state,
    codes: codes.filter((c): c is NonNullable<typeof c> => c !== undefined).map(String),
  };
}

// The page's markup this script reads: #filter-q (the box), tr.vmi rows with
// data-state, a.name, .ns and the codes in td.problems; #filter-count and
// #filter-empty (with #filter-empty-q) to update; links marked data-keep-q
// carry the query on; body[data-refresh] is the reload period, which the
// script takes over from meta refresh (that one would reload the URL the
// page was loaded from, losing what was typed since).
/** The status page's one script, inline and allowed by FILTER_SCRIPT_HASH. */
export const FILTER_SCRIPT = `(() => {
'use strict';
const normalize = ${normalizeQueryText.toString()};
const matches = ${queryMatches.toString()};
const MAX = ${MAX_QUERY_LENGTH};
const input = document.getElementById('filter-q');
const count = document.getElementById('filter-count');
const empty = document.getElementById('filter-empty');
const emptyQuery = document.getElementById('filter-empty-q');
const text = (el) => (el ? el.textContent : '');
const rows = Array.from(document.querySelectorAll('tr.vmi'), (tr) => ({
  tr,
  fields: {
    name: text(tr.querySelector('a.name')),
    namespace: text(tr.querySelector('.ns')),
    state: tr.dataset.state || '',
    codes: Array.from(tr.querySelectorAll('td.problems code'), text),
  },
}));
const withQuery = (href, q) => {
  const url = new URL(href, location.href);
  if (q) url.searchParams.set('q', q);
  else url.searchParams.delete('q');
  return url;
};
let typedAt = 0;
const apply = () => {
  const q = normalize(input.value, MAX);
  let shown = 0;
  for (const row of rows) {
    const show = matches(q, row.fields);
    row.tr.hidden = !show;
    if (show) shown++;
  }
  if (count) count.textContent = shown + ' of ' + rows.length + ' shown';
  if (empty) empty.hidden = shown > 0;
  if (emptyQuery) emptyQuery.textContent = q.trim();
  const kept = q.trim();
  history.replaceState(history.state, '', withQuery(location.href, kept));
  for (const a of document.querySelectorAll('a[data-keep-q]')) a.href = withQuery(a.getAttribute('href'), kept);
};
if (input) {
  input.addEventListener('input', () => {
    typedAt = Date.now();
    apply();
  });
  apply();
  if (history.state && history.state.filterFocus) {
    input.focus();
    input.setSelectionRange(input.value.length, input.value.length);
  }
}
const seconds = Number(document.body.dataset.refresh);
if (seconds > 0) {
  const reload = () => {
    if (Date.now() - typedAt < 2000) {
      setTimeout(reload, 1000);
      return;
    }
    history.replaceState({ filterFocus: input !== null && document.activeElement === input }, '');
    location.reload();
  };
  setTimeout(reload, seconds * 1000);
}
})();`;

/** The CSP source that lets FILTER_SCRIPT, and no other script, run. */
export const FILTER_SCRIPT_HASH = `sha256-${createHash('sha256').update(FILTER_SCRIPT).digest('base64')}`;
