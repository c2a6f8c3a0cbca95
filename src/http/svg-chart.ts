// Inline SVG line chart of recent seed generation latencies. Pure: points in,
// markup out. Presentation attributes only (no style=""), so the page's
// strict Content-Security-Policy needs no 'unsafe-inline'.
import { formatSeconds, formatTime } from '../core/format.ts';
import { esc } from './html.ts';

export interface ChartPoint {
  at: string;
  seconds: number;
}

export interface ChartOptions {
  width?: number;
  height?: number;
  title?: string;
}

const PAD = { left: 64, right: 12, top: 12, bottom: 22 };

export function renderLatencyChart(points: readonly ChartPoint[], options: ChartOptions = {}): string {
  const width = options.width ?? 560;
  const height = options.height ?? 140;
  const title = options.title ?? 'Recent seed generation latencies';
  const valid = points.filter((p) => Number.isFinite(p.seconds) && p.seconds >= 0);
  const open = `<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" aria-label="${esc(title)}"><title>${esc(title)}</title>`;
  const frame = `<rect x="0.5" y="0.5" width="${width - 1}" height="${height - 1}" fill="#fff" stroke="#d0d7de"/>`;
  if (valid.length === 0) {
    return `${open}${frame}<text x="${width / 2}" y="${height / 2}" text-anchor="middle" fill="#57606a" font-size="13">no generations yet</text></svg>`;
  }
  const max = Math.max(...valid.map((p) => p.seconds));
  // Round the top of the axis up to 1/2/5 × 10^n so the label is readable.
  const top = niceCeil(max > 0 ? max : 0.001);
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const x = (i: number) => PAD.left + (valid.length === 1 ? plotW / 2 : (i * plotW) / (valid.length - 1));
  const y = (s: number) => PAD.top + plotH - (s / top) * plotH;
  const r = (n: number) => n.toFixed(1);

  const grid = [0, 0.5, 1]
    .map((f) => {
      const gy = r(PAD.top + plotH - f * plotH);
      return `<line x1="${PAD.left}" x2="${width - PAD.right}" y1="${gy}" y2="${gy}" stroke="#eaeef2"/><text x="${PAD.left - 6}" y="${gy}" dy="4" text-anchor="end" fill="#57606a" font-size="11">${esc(formatSeconds(top * f))}</text>`;
    })
    .join('');
  const line =
    valid.length > 1
      ? `<polyline fill="none" stroke="#0969da" stroke-width="1.5" points="${valid.map((p, i) => `${r(x(i))},${r(y(p.seconds))}`).join(' ')}"/>`
      : '';
  const dots = valid
    .map(
      (p, i) =>
        `<circle class="pt" cx="${r(x(i))}" cy="${r(y(p.seconds))}" r="3" fill="#0969da"><title>${esc(formatTime(p.at))}: ${esc(formatSeconds(p.seconds))}</title></circle>`,
    )
    .join('');
  const caption = `<text x="${PAD.left}" y="${height - 6}" fill="#57606a" font-size="11">${valid.length} generation${valid.length === 1 ? '' : 's'}, oldest left · max ${esc(formatSeconds(max))}</text>`;
  return `${open}${frame}${grid}${line}${dots}${caption}</svg>`;
}

export function niceCeil(v: number): number {
  const exp = Math.floor(Math.log10(v));
  const base = 10 ** exp;
  for (const m of [1, 2, 5, 10]) if (m * base >= v * (1 - 1e-12)) return m * base;
  return 10 * base;
}
