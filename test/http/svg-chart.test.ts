import { test } from 'node:test';
import assert from 'node:assert/strict';
import { niceCeil, renderLatencyChart } from '../../src/http/svg-chart.ts';

const circles = (svg: string) =>
  [...svg.matchAll(/<circle class="pt" cx="([\d.]+)" cy="([\d.]+)"/g)].map((m) => ({
    x: Number(m[1]),
    y: Number(m[2]),
  }));

test('no points: an empty chart that says so', () => {
  const svg = renderLatencyChart([]);
  assert.match(svg, /^<svg [^>]*>.*<\/svg>$/s);
  assert.match(svg, /no generations yet/);
  assert.equal(circles(svg).length, 0);
  assert.ok(!svg.includes('polyline'));
});

test('one point: a single centred dot, no line', () => {
  const svg = renderLatencyChart([{ at: '2026-11-22T03:00:00Z', seconds: 0.004 }], { width: 200, height: 100 });
  const pts = circles(svg);
  assert.equal(pts.length, 1);
  assert.ok(!svg.includes('polyline'));
  assert.ok(Math.abs(pts[0].x - (64 + (200 - 64 - 12) / 2)) < 0.1);
  assert.match(svg, /1 generation,/);
  assert.match(svg, /<title>2026-11-22 03:00:00Z: 4.00 ms<\/title>/);
});

test('many points: ordered left to right, higher latency drawn higher', () => {
  const secs = [0.001, 0.01, 0.002, 0.05, 0.0005];
  const svg = renderLatencyChart(secs.map((seconds, i) => ({ at: `2026-11-22T03:0${i}:00Z`, seconds })));
  const pts = circles(svg);
  assert.equal(pts.length, 5);
  for (let i = 1; i < pts.length; i++) assert.ok(pts[i].x > pts[i - 1].x);
  // SVG y grows downwards: the slowest (index 3) has the smallest y.
  assert.equal(Math.min(...pts.map((p) => p.y)), pts[3].y);
  assert.equal(Math.max(...pts.map((p) => p.y)), pts[4].y);
  assert.match(svg, /<polyline [^>]*points="[^"]+"/);
  assert.match(svg, />50.0 ms</, 'axis top is the max rounded to 1/2/5');
  assert.match(svg, /max 50.0 ms/);
});

test('non-finite and negative values are dropped; all-zero values still draw', () => {
  const svg = renderLatencyChart([
    { at: 'a', seconds: NaN },
    { at: 'b', seconds: -1 },
    { at: 'c', seconds: 0 },
    { at: 'd', seconds: 0 },
  ]);
  assert.equal(circles(svg).length, 2);
  assert.ok(!/NaN|Infinity/.test(svg));
});

test('point titles are escaped', () => {
  const svg = renderLatencyChart([{ at: '<b>x</b>', seconds: 1 }]);
  assert.ok(!svg.includes('<b>'));
  assert.ok(svg.includes('&lt;b&gt;'));
});

test('niceCeil rounds up to 1, 2 or 5 times a power of ten', () => {
  assert.equal(niceCeil(0.0034), 0.005);
  assert.equal(niceCeil(0.05), 0.05);
  assert.equal(niceCeil(1.2), 2);
  assert.equal(niceCeil(7), 10);
});
