"""The page script and style of the timeline HTML (vendored; no network).

The script reads the JSON payload from ``<script type="application/json"
id="tk-data">``, decodes the typed arrays, builds one plotly figure with
subplots (one WebGL canvas set for the whole page) and writes a status object
into ``<pre id="tk-status">`` for headless tests and the benchmark:
``{ok, errors, lanes, traces, segments, render_ms, zoom_ms?, zoom_overview_ms?}``.
``location.hash`` containing ``bench`` runs programmatic zoom steps after the
first render. Strings in the payload are already HTML-escaped by Python; the
script only concatenates them into plotly labels and never writes innerHTML
from data.
"""

from __future__ import annotations

__all__ = ["TIMELINE_JS", "TIMELINE_CSS"]

TIMELINE_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 16px;color:#222;font-size:13px}
h1{font-size:18px;margin:12px 0 4px} h2{font-size:14px;margin:14px 0 4px}
.meta{color:#555} table{border-collapse:collapse;margin:4px 0} h1 .meta{font-size:12px;font-weight:normal}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#f4f4f4} td.l,th.l{text-align:left;white-space:normal}
.chip{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle;border-radius:2px}
.legend span{margin-right:12px;white-space:nowrap}
tr.jump{cursor:pointer} tr.jump:hover{background:#fff3d6}
.cols{display:flex;gap:24px;flex-wrap:wrap} .note{color:#616161;font-size:12px}
#tk-status{display:none} code{background:#f4f4f4;padding:0 3px}
td.name{text-align:left;white-space:normal;overflow-wrap:anywhere;word-break:break-all;max-width:52ch;font-family:monospace;font-size:11px}
td small{color:#616161}
.chooser{margin:10px 0 0;padding:6px 8px;background:#f7f7f7;border:1px solid #e3e3e3;border-radius:3px}
.chooser select{max-width:70ch;font-size:12px}
"""

TIMELINE_JS = r"""
(function () {
"use strict";
var T0 = performance.now();
var STATUS = {ok: false, errors: [], lanes: [], traces: 0, segments: 0};
function writeStatus() {
  var el = document.getElementById('tk-status');
  if (el) el.textContent = JSON.stringify(STATUS);
}
function fail(m) { STATUS.errors.push(String(m)); writeStatus(); }
window.addEventListener('error', function (e) { fail('error: ' + (e && e.message ? e.message : e)); });
window.addEventListener('unhandledrejection', function (e) {
  fail('rejection: ' + (e && e.reason && e.reason.message ? e.reason.message : e && e.reason));
});
var _ce = console.error;
console.error = function () {
  STATUS.errors.push('console.error: ' + Array.prototype.join.call(arguments, ' '));
  return _ce.apply(console, arguments);
};

function dec(a) {
  if (!a) return null;
  var bin = atob(a.b), n = bin.length, u = new Uint8Array(n);
  for (var i = 0; i < n; i++) u[i] = bin.charCodeAt(i);
  switch (a.t) {
    case 'f4': return new Float32Array(u.buffer);
    case 'f8': return new Float64Array(u.buffer);
    case 'u1': return u;
    case 'u2': return new Uint16Array(u.buffer);
    case 'u4': return new Uint32Array(u.buffer);
    case 'i4': return new Int32Array(u.buffer);
  }
  throw new Error('unknown array type ' + a.t);
}
function fmtDur(us) {
  if (us >= 1e6) return (us / 1e6).toFixed(3) + ' s';
  if (us >= 1000) return (us / 1000).toFixed(3) + ' ms';
  return us.toFixed(us < 10 ? 2 : 1) + ' µs';
}
// a time point on the capture's clock (ms from its start), in the unit that reads best
function fmtMs(ms) { return Math.abs(ms) >= 1000 ? (ms / 1000).toFixed(6) + ' s' : ms.toFixed(3) + ' ms'; }
// tick values and labels of a time axis (values in ms): about one tick per 110 px, labels in s, ms or µs by
// the size of the times shown (17.5 s, not "17.5k ms"), with the decimals the tick step needs
function timeTicks(lo, hi, px) {
  var span = hi - lo;
  if (!(span > 0) || !isFinite(span)) return null;
  var raw = span / Math.max(2, Math.floor(px / 110)), p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
  var step = (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p, mag = Math.max(Math.abs(lo), Math.abs(hi));
  var u = mag >= 1000 ? [1000, ' s'] : mag >= 1 ? [1, ' ms'] : [1e-3, ' µs'];
  var dec = Math.min(9, Math.max(0, Math.ceil(-Math.log10(step / u[0]) - 1e-9)));
  var vals = [], text = [];
  for (var k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9 && vals.length < 80; k++) {
    vals.push(k * step); text.push((k * step / u[0]).toFixed(dec) + u[1]);
  }
  return {tickmode: 'array', tickvals: vals, ticktext: text};
}
var FONT = '"Open Sans", verdana, arial, sans-serif', _measure = null;
function textPx(t, size) {
  if (!_measure) { try { _measure = document.createElement('canvas').getContext('2d'); } catch (e) { _measure = false; } }
  if (!_measure) return t.length * size * 0.62;
  _measure.font = size + 'px ' + FONT;
  return _measure.measureText(t).width;
}
var RANK_COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f',
                   '#bcbd22', '#17becf'];
function lighten(hex, f) {
  var n = parseInt(hex.slice(1), 16), r = n >> 16, g = (n >> 8) & 255, b = n & 255;
  r = Math.round(r + (255 - r) * f); g = Math.round(g + (255 - g) * f); b = Math.round(b + (255 - b) * f);
  return 'rgb(' + r + ',' + g + ',' + b + ')';
}

var P = JSON.parse(document.getElementById('tk-data').textContent);
var gd = document.getElementById('tk-plot');
window.tkTimeline = {gd: gd, payload: P, status: STATUS};
var CATS = P.cats, COLORS = P.colors, NC = CATS.length, LABEL_COLORS = P.label_colors || COLORS.map(function () { return '#000'; });
var traces = [], layout, axN = 0, top = 0, GAP = 28, nLegend = 1;
var D = P.detail, OV = P.overview;
var LANE_PX = 22, LW = 14;
var nLanes = D.lanes.length;
// initial detail view (a representative stretch) inside the embedded data range [x0_ms, x1_ms]
var VIEW0 = D.v0_ms !== undefined ? D.v0_ms : D.x0_ms, VIEW1 = D.v1_ms !== undefined ? D.v1_ms : D.x1_ms;
STATUS.lanes = D.lanes.map(function (l) { return l.label; });

// the left margin holds the longest lane / row label whole (at most 360 px)
var ML = 60;
STATUS.lanes.concat(OV.rows.length ? ['rank ' + OV.rows[OV.rows.length - 1][0]] : []).forEach(function (t) {
  ML = Math.max(ML, textPx(t, 10) + 18);
});
(P.counters || []).forEach(function (g) { g.rows.forEach(function (r) { ML = Math.max(ML, textPx('r' + r[0] + ' ' + r[1], 8) + 18); }); });
ML = Math.min(360, Math.ceil(ML));
var PLOT_W = Math.max(300, (gd.clientWidth || 1200) - ML - 24);

// ---- vertical plan (px); a counter chart's gap above it holds its title and legend (rows as they wrap)
var blocks = [], CUR_GAP = GAP;
var ovRows = OV.rows.length;
if (ovRows) blocks.push({kind: 'ov', h: Math.max(90, ovRows * 7)});
(P.counters || []).forEach(function (g) { blocks.push({kind: 'ovc', h: Math.max(24, g.rows.length * 10), g: g}); });
blocks.push({kind: 'det', h: Math.max(120, nLanes * LANE_PX)});
var detGroups = groupCounters(P.counters_window), DETC_STANDOFF = 6;
detGroups.forEach(function (g) {
  var items = 0, titleW = textPx(g.title + ' (' + g.unit + ')', 10) + 24;
  g.series.forEach(function (s) { items += textPx('r' + s.rank + ' ' + s.name, 10) + 46; });
  var rows = Math.max(1, Math.ceil(items / Math.max(200, PLOT_W - titleW)));
  // the gap holds the chart above's time ticks (pushed down by DETC_STANDOFF), then this chart's title and legend
  blocks.push({kind: 'detc', h: 85, g: g, gap: 30 + DETC_STANDOFF + 19 * rows});
});
var plotH = 0;
blocks.forEach(function (b, i) { plotH += b.h + (i ? (b.gap || GAP) : 0); });
// the top margin: plotly's tool bar (30 px), the legend's rows as they wrap, then the overview's top axis
var legendW = 0;
['step', 'range (NVTX)', 'folded (short ops)', 'collective wait', 'collective link (release)', 'stall', 'PCIe-bound']
  .concat(CATS).forEach(function (t) { legendW += textPx(t, 11) + 50; });
var LEGEND_ROWS = Math.max(1, Math.ceil(legendW / PLOT_W)), MT = 30 + 21 * LEGEND_ROWS + 48, MB = 45, H = plotH + MT + MB;
layout = {
  height: H, margin: {l: ML, r: 24, t: MT, b: MB}, hovermode: 'closest', dragmode: 'zoom',
  showlegend: true, legend: {orientation: 'h', x: 0, y: 1 + (MT - 30) / plotH, yanchor: 'top', font: {size: 11}},
  plot_bgcolor: '#ffffff', paper_bgcolor: '#ffffff', font: {size: 11}, shapes: [], annotations: [],
  hoverlabel: {align: 'left', namelength: -1}
};
function groupCounters(list) {
  var groups = [], byName = {};
  (list || []).forEach(function (c) {
    if (!byName[c.group]) { byName[c.group] = {title: c.group, unit: c.unit, series: []}; groups.push(byName[c.group]); }
    byName[c.group].series.push(c);
  });
  return groups;
}
function addAxes(h, matches, yopts, xopts) {
  axN += 1;
  var xs = axN === 1 ? '' : String(axN);
  if (axN > 1) top += CUR_GAP;
  var d1 = 1 - top / plotH, d0 = 1 - (top + h) / plotH;
  top += h;
  var xa = {domain: [0, 1], anchor: 'y' + xs, showgrid: true, gridcolor: '#eee', zeroline: false,
            tickfont: {size: 10}};
  if (matches) xa.matches = matches;
  var ya = {domain: [Math.max(0, d0), Math.min(1, d1)], anchor: 'x' + xs, zeroline: false, tickfont: {size: 10}};
  Object.keys(xopts || {}).forEach(function (k) { xa[k] = xopts[k]; });
  Object.keys(yopts || {}).forEach(function (k) { ya[k] = yopts[k]; });
  var r = xa.range || (matches && layout[matches.replace('x', 'xaxis')] || {}).range, t = r ? timeTicks(r[0], r[1], PLOT_W) : null;
  if (t) Object.keys(t).forEach(function (k) { xa[k] = t[k]; });
  layout['xaxis' + xs] = xa; layout['yaxis' + xs] = ya;
  return {x: 'x' + xs, y: 'y' + xs, xs: xs};
}

var ovAx = null, detAx = null;
blocks.forEach(function (b) {
  CUR_GAP = b.gap || GAP;
  if (b.kind === 'ov') {
    var rankTicks = [], rankText = [], prev = null;
    OV.rows.forEach(function (r, i) { if (r[0] !== prev) { rankTicks.push(i); rankText.push('rank ' + r[0]); prev = r[0]; } });
    ovAx = addAxes(b.h, null, {autorange: false, range: [ovRows - 0.5, -0.5], fixedrange: true, tickvals: rankTicks,
                               ticktext: rankText, showgrid: false},
                   {range: [0, P.span_ms], title: {text: 'overview: busy share per rank × category (whole capture)',
                                                  font: {size: 11}, standoff: 2}, side: 'top'});
    buildOverview(ovAx);
  } else if (b.kind === 'ovc') {
    buildCounterStrip(b.g, b.h);
  } else if (b.kind === 'det') {
    detAx = addAxes(b.h, null, {autorange: false, range: [nLanes - 0.5, -0.5], fixedrange: true,
                                tickvals: D.lanes.map(function (l, i) { return i; }), ticktext: STATUS.lanes,
                                showgrid: false},
                    {range: [VIEW0, VIEW1], title: {text: 'detail: ' + D.reason, font: {size: 11}, standoff: 2},
                     side: 'top'});
    buildDetail(detAx);
  } else if (b.kind === 'detc') {
    // time labels a little below the axis: the first ("0 ms") clears the y axis' bottom label ("0")
    var a2 = addAxes(b.h, detAx ? detAx.x : null, {fixedrange: true, rangemode: 'tozero'}, {ticklabelstandoff: DETC_STANDOFF});
    buildCounters(a2, b.g, 1);
  }
});

function buildOverview(ax) {
  var nb = OV.nbins, q = dec(OV.z), x = new Array(nb), z = [], text = [], y = [];
  for (var j = 0; j < nb; j++) x[j] = (j + 0.5) * OV.bin_ms;
  for (var i = 0; i < ovRows; i++) {
    var r = OV.rows[i], c = r[1], row = new Array(nb), trow = new Array(nb), lab = 'rank ' + r[0] + ' · ' + CATS[c];
    for (var k = 0; k < nb; k++) {
      var v = q[i * nb + k];
      if (v === 0) { row[k] = null; trow[k] = ''; }
      else { row[k] = c + 0.1 + 0.89 * v / 255; trow[k] = lab + '<br>busy ' + (100 * v / 255).toFixed(0) + '%'; }
    }
    z.push(row); text.push(trow); y.push(i);
  }
  var cs = [];
  for (var c2 = 0; c2 < NC; c2++) {
    cs.push([c2 / NC, lighten(COLORS[c2], 0.85)]);
    cs.push([(c2 + 1) / NC - 1e-6, COLORS[c2]]);
  }
  if (cs.length === 0) cs = [[0, '#fff'], [1, '#000']];
  cs[cs.length - 1][0] = 1;
  traces.push({type: 'heatmap', x: x, y: y, z: z, text: text, zmin: 0, zmax: NC, colorscale: cs, showscale: false,
               xaxis: ax.x, yaxis: ax.y, hovertemplate: '%{text}<br>t=%{x:.1f} ms<extra></extra>', hoverongaps: false,
               name: 'overview', showlegend: false});
  // profiled spans (profiler windows) as a light band under the heat map, the detail view as a dotted box
  (P.spans_ms || []).forEach(function (sp) {
    layout.shapes.push({type: 'rect', xref: ax.x, yref: ax.y + ' domain', x0: sp[0], x1: sp[1], y0: 0, y1: 1, layer: 'below',
                        line: {width: 0}, fillcolor: 'rgba(76,114,176,0.07)'});
  });
  window.tkTimeline.boxShape = layout.shapes.length;
  layout.shapes.push({type: 'rect', xref: ax.x, yref: ax.y + ' domain', x0: VIEW0, x1: VIEW1, y0: 0, y1: 1,
                      line: {color: '#000', width: 1, dash: 'dot'}, fillcolor: 'rgba(0,0,0,0.06)'});
  var st = P.stalls_all || [];
  if (st.length) {
    var firstRow = {};
    OV.rows.forEach(function (r, i) { if (!(r[0] in firstRow)) firstRow[r[0]] = i; });
    var sx = [], sy = [], stx = [];
    st.forEach(function (s) {
      sx.push(s.t_ms); sy.push(s.rank !== null && s.rank in firstRow ? firstRow[s.rank] : 0);
      stx.push('stall · ' + s.label + (s.rank !== null ? ' · rank ' + s.rank : '') + '<br>' + fmtDur(s.d_ms * 1000) +
               (s.detail ? '<br>' + s.detail : ''));
    });
    traces.push({type: 'scatter', mode: 'markers', x: sx, y: sy, text: stx, hovertemplate: '%{text}<extra></extra>',
                 marker: {symbol: 'triangle-down', size: 9, color: '#000'}, xaxis: ax.x, yaxis: ax.y,
                 name: 'stall', legendgroup: 'stall', showlegend: false});
  }
}

// whole-capture counters: one heat strip per (rank, counter), colour = mean value in the bin
function buildCounterStrip(g, h) {
  var nr = g.rows.length, ticks = [], ttext = [];
  g.rows.forEach(function (r, i) {
    ticks.push(i);
    ttext.push('r' + r[0] + ' ' + r[1].replace(/_bytes_per_s$|_pct$|_w$|_mhz$/, ''));
  });
  var ax = addAxes(h, ovAx ? 'x' : null, {autorange: false, range: [nr - 0.5, -0.5], fixedrange: true, tickvals: ticks,
                                          ticktext: ttext, showgrid: false, tickfont: {size: 8}}, {showticklabels: false});
  var dom = layout['yaxis' + ax.xs].domain;
  layout.annotations.push({xref: 'paper', yref: 'paper', x: 0, y: dom[1], xanchor: 'left', yanchor: 'bottom',
                           showarrow: false, font: {size: 10, color: '#444'},
                           text: g.group + ' · colour scale ' + g.zmin.toPrecision(3) + '–' + g.zmax.toPrecision(3) + ' ' + g.unit});
  var nb = g.nbins, v = dec(g.z), x = new Array(nb), z = [], y = [], text = [];
  for (var j = 0; j < nb; j++) x[j] = (j + 0.5) * OV.bin_ms;
  for (var i = 0; i < nr; i++) {
    var row = new Array(nb), lab = 'rank ' + g.rows[i][0] + ' · ' + g.rows[i][1];
    for (var k = 0; k < nb; k++) { var q = v[i * nb + k]; row[k] = isNaN(q) ? null : q; }
    z.push(row); y.push(i); text.push(new Array(nb).fill(lab));
  }
  traces.push({type: 'heatmap', x: x, y: y, z: z, zmin: g.zmin, zmax: g.zmax, colorscale: 'Viridis', showscale: false,
               text: text, xaxis: ax.x, yaxis: ax.y, hoverongaps: false, showlegend: false, name: g.group,
               hovertemplate: '%{text}<br>%{z:.2f} ' + g.unit + ' at %{x:.1f} ms<extra></extra>'});
}

// detail-window counters: SVG lines (few points; keeps the WebGL canvas for the kernels), each chart with its
// title and a legend of its own above it (one line per rank and counter)
function buildCounters(ax, g, det) {
  var dom = layout['yaxis' + ax.xs].domain, lg = 'legend' + (++nLegend);
  layout.annotations.push({xref: 'paper', yref: 'paper', x: 0, y: dom[1], xanchor: 'left', yanchor: 'bottom',
                           showarrow: false, font: {size: 10, color: '#444'}, text: g.title + ' (' + g.unit + ')'});
  layout[lg] = {orientation: 'h', x: 1, xanchor: 'right', y: dom[1], yanchor: 'bottom', font: {size: 10},
                bgcolor: 'rgba(255,255,255,0)', borderwidth: 0, tracegroupgap: 0};
  g.series.forEach(function (s) {
    var isTx = /tx|write|out/.test(s.name);
    traces.push({type: 'scatter', mode: 'lines', x: Array.from(dec(s.x)), y: Array.from(dec(s.y)), xaxis: ax.x, yaxis: ax.y,
                 name: 'r' + s.rank + ' ' + s.name, showlegend: true, legend: lg,
                 line: {width: 1.2, color: RANK_COLORS[s.rank % RANK_COLORS.length], dash: isTx ? 'dot' : 'solid'},
                 hovertemplate: 'rank ' + s.rank + ' · ' + s.name + '<br>%{y:.2f} ' + s.unit + ' at %{x:.3f} ms<extra></extra>'});
  });
}

function segTrace(ax, xs, ys, color, width, name, group, legend) {
  return {type: 'scattergl', mode: 'lines', x: xs, y: ys, xaxis: ax.x, yaxis: ax.y, hoverinfo: 'skip',
          line: {color: color, width: width}, name: name, legendgroup: group, showlegend: legend, connectgaps: false};
}
function hoverTrace(ax, xs, ys, text, color, group, size) {
  return {type: 'scattergl', mode: 'markers', x: xs, y: ys, text: text, xaxis: ax.x, yaxis: ax.y,
          hovertemplate: '%{text}<extra></extra>', legendgroup: group, showlegend: false,
          marker: {size: 1, color: 'rgba(0,0,0,0)'}};
}
// segments of [s, s + d) µs offsets → ms arrays with NaN separators
function segments(idx, start, dur, laneArr, x0, dy) {
  var n = idx.length, xs = new Float64Array(3 * n), ys = new Float64Array(3 * n);
  for (var i = 0; i < n; i++) {
    var k = idx[i], s = x0 + start[k] / 1000, e = s + dur[k] / 1000, y = laneArr[k] + (dy || 0);
    xs[3 * i] = s; xs[3 * i + 1] = e; xs[3 * i + 2] = NaN;
    ys[3 * i] = y; ys[3 * i + 1] = y; ys[3 * i + 2] = NaN;
  }
  return [xs, ys];
}
function mids(idx, start, dur, laneArr, x0) {
  var n = idx.length, xs = new Float64Array(n), ys = new Float64Array(n);
  for (var i = 0; i < n; i++) { var k = idx[i]; xs[i] = x0 + (start[k] + dur[k] / 2) / 1000; ys[i] = laneArr[k]; }
  return [xs, ys];
}

function buildDetail(ax) {
  var x0 = D.x0_ms, lanes = D.lanes, i, k;
  // rank bands (alternate ranks shaded) so lanes group visually
  var bx = [], by = [], seen = {}, band = 0, far0 = -1e12, far1 = 1e12;
  lanes.forEach(function (l) {
    if (seen[l.rank]) return; seen[l.rank] = true; band += 1;
    if (band % 2 === 0) { bx.push(far0, far1, far1, far0, far0, null); by.push(l.first - 0.5, l.first - 0.5, l.last + 0.5, l.last + 0.5, l.first - 0.5, null); }
  });
  if (bx.length) traces.push({type: 'scatter', mode: 'lines', x: bx, y: by, fill: 'toself', fillcolor: 'rgba(0,0,0,0.035)',
                              line: {width: 0}, hoverinfo: 'skip', showlegend: false, xaxis: ax.x, yaxis: ax.y, name: 'bands'});
  // PCIe-bound phases: shaded over the rank's lanes
  var firstLane = {}, lastLane = {};
  lanes.forEach(function (l) { firstLane[l.rank] = l.first; lastLane[l.rank] = l.last; });
  if (D.pcie.length) {
    var px = [], py = [], pt = [];
    D.pcie.forEach(function (p) {
      var s = x0 + p.s / 1000, e = s + p.d / 1000;
      var a = p.rank === null ? -0.5 : (p.rank in firstLane ? firstLane[p.rank] - 0.5 : null);
      var b = p.rank === null ? nLanes - 0.5 : (p.rank in lastLane ? lastLane[p.rank] + 0.5 : null);
      if (a === null) return;
      px.push(s, e, e, s, s, null); py.push(a, a, b, b, a, null);
      var t = 'PCIe-bound' + (p.label ? ' · ' + p.label : '') + (p.rank !== null ? ' · rank ' + p.rank : '') +
              '<br>' + fmtDur(p.d) + (p.detail ? '<br>' + p.detail : '');
      pt.push(t, t, t, t, t, null);
    });
    traces.push({type: 'scatter', mode: 'lines', x: px, y: py, fill: 'toself', fillcolor: 'rgba(148,103,189,0.16)',
                 line: {width: 0}, hoveron: 'fills', text: pt, hoverinfo: 'text', name: 'PCIe-bound',
                 xaxis: ax.x, yaxis: ax.y, showlegend: true});
  }
  // steps
  if (D.steps) {
    var S = D.steps, ss = dec(S.start), sd = dec(S.dur), sl = dec(S.lane), sid = dec(S.id), even = [], odd = [], all = [];
    for (i = 0; i < S.n; i++) { (sid[i] % 2 === 0 ? even : odd).push(i); all.push(i); }
    var se = segments(even, ss, sd, sl, x0), so = segments(odd, ss, sd, sl, x0);
    traces.push(segTrace(ax, se[0], se[1], '#4c72b0', LW, 'step', 'step', true));
    traces.push(segTrace(ax, so[0], so[1], '#9fb4d8', LW, 'step (odd)', 'step', false));
    var sm = mids(all, ss, sd, sl, x0), stext = all.map(function (j) { return S.label[j] + '<br>' + fmtDur(sd[j]) + ' · starts ' + fmtMs(x0 + ss[j] / 1000); });
    traces.push(hoverTrace(ax, sm[0], sm[1], stext, '#4c72b0', 'step', LW));
    STATUS.segments += S.n;
  }
  // ranges (NVTX / record_function)
  if (D.ranges) {
    var R = D.ranges, rs = dec(R.start), rd = dec(R.dur), rl = dec(R.lane), rn = dec(R.name), ri = [];
    for (i = 0; i < R.n; i++) ri.push(i);
    var rsg = segments(ri, rs, rd, rl, x0), rm = mids(ri, rs, rd, rl, x0);
    traces.push(segTrace(ax, rsg[0], rsg[1], '#6a9f58', LW * 0.8, 'range (NVTX)', 'range', true));
    traces.push(hoverTrace(ax, rm[0], rm[1], ri.map(function (j) { return R.names[rn[j]] + '<br>range · ' + fmtDur(rd[j]); }),
                           '#6a9f58', 'range', LW * 0.8));
    STATUS.segments += R.n;
  }
  // folded kernels
  if (D.folded) {
    var F = D.folded, fs = dec(F.start), fd = dec(F.dur), fl = dec(F.lane), fc = dec(F.count), fb = dec(F.busy), fi = [];
    for (i = 0; i < F.n; i++) fi.push(i);
    var fsg = segments(fi, fs, fd, fl, x0, 0.3), fm = mids(fi, fs, fd, fl, x0);
    traces.push(segTrace(ax, fsg[0], fsg[1], '#bbbbbb', 4, 'folded (short ops)', 'folded', true));
    traces.push(hoverTrace(ax, fm[0], fm[1], fi.map(function (j) { return 'folded: ' + fc[j] + ' short ops<br>busy ' + fmtDur(fb[j]) + ' in ' + fmtDur(fd[j]); }),
                           '#999', 'folded', 6));
    STATUS.segments += F.n;
  }
  // kernels per category
  var K = D.kernels, ks = dec(K.start), kd = dec(K.dur), kl = dec(K.lane), kc = dec(K.cat), kn = dec(K.name),
      kg = dec(K.cfg), kst = dec(K.step), kk = dec(K.kind), n = K.n;
  var C = D.coll, collOf = null, cw, cpg, cseq, clate, cnr;
  if (C) {
    collOf = new Int32Array(n).fill(-1);
    var cidx = dec(C.idx); cw = dec(C.wait); cpg = dec(C.pg); cseq = dec(C.seq); clate = dec(C.late); cnr = dec(C.nr);
    for (i = 0; i < C.n; i++) collOf[cidx[i]] = i;
  }
  var KIND = ['kernel', 'memcpy', 'memset'];
  function kernelText(k) {
    var t = '<b>' + D.names[kn[k]] + '</b><br>' + CATS[kc[k]] + ' · ' + KIND[kk[k]] + ' · ' + fmtDur(kd[k]) +
            '<br>start ' + fmtMs(x0 + ks[k] / 1000) + ' · ' + lanes[kl[k]].label;
    if (kg[k]) t += '<br>' + D.cfgs[kg[k]];
    if (kst[k] >= 0) t += '<br>step ' + kst[k];
    if (collOf && collOf[k] >= 0) {
      var q = collOf[k];
      t += '<br>collective pg ' + C.pgs[cpg[q]] + ' seq ' + cseq[q] + ' · ' + cnr[q] + ' ranks' +
           '<br>wait ' + fmtDur(cw[q]) + ' · transfer ' + fmtDur(Math.max(kd[k] - cw[q], 0)) +
           (clate[q] >= 0 ? ' · last to arrive: rank ' + clate[q] : '');
    }
    return t;
  }
  // ops are sorted by (lane, start): per-lane index ranges for binary search
  var laneLo = new Int32Array(nLanes + 1).fill(-1);
  for (i = n - 1; i >= 0; i--) laneLo[kl[i]] = i;
  laneLo[nLanes] = n;
  for (i = nLanes - 1; i >= 0; i--) if (laneLo[i] < 0) laneLo[i] = laneLo[i + 1];
  var maxDur = 0;
  for (i = 0; i < n; i++) if (kd[i] > maxDur) maxDur = kd[i];
  // Level of detail for the current x range: ops at least MIN_PX wide are drawn exactly; narrower ops
  // that fall in the same pixel column of a lane are merged into one ≥1 px segment coloured by the
  // category with most busy time there (nsys-style). Only ops near the visible range are drawn.
  // Small windows (≤ LOD_MIN_OPS ops) are drawn exactly once: a zoom is then one relayout, no restyle.
  var LOD_MIN_OPS = 20000, LOD_ON = n > LOD_MIN_OPS, MIN_PX = LOD_ON ? 1.5 : 0;
  function buildLOD(lo, hi) {
    var plotW = (gd._fullLayout && gd._fullLayout._size) ? gd._fullLayout._size.w : Math.max(400, gd.clientWidth - 164);
    var msPerPx = (hi - lo) / Math.max(plotW, 100), span = hi - lo;
    var vlo = LOD_ON ? (lo - span * 0.25 - x0) * 1000 : -Infinity, vhi = LOD_ON ? (hi + span * 0.25 - x0) * 1000 : Infinity;
    var segX = [], segY = [], hx = [], hy = [], ht = [], c2;
    for (c2 = 0; c2 < NC; c2++) { segX.push([]); segY.push([]); hx.push([]); hy.push([]); ht.push([]); }
    var busy = new Float64Array(NC), drawn = 0, merged = 0, inView = 0, inViewOps = 0;
    var rlo = (lo - x0) * 1000, rhi = (hi - x0) * 1000;
    for (var L = 0; L < nLanes; L++) {
      var a = laneLo[L], b = laneLo[L + 1];
      if (a >= b) continue;
      // first op that may be visible: start >= vlo - maxDur
      var lo2 = a, hi2 = b, target = vlo - maxDur;
      while (lo2 < hi2) { var m = (lo2 + hi2) >> 1; if (ks[m] < target) lo2 = m + 1; else hi2 = m; }
      var col = -1e18, bS = 0, bE = 0, bN = 0, bLong = -1;
      var flush = function () {
        if (bN === 0) return;
        var best = 0;
        for (var q = 1; q < NC; q++) if (busy[q] > busy[best]) best = q;
        var s0 = x0 + bS / 1000, e0 = Math.max(x0 + bE / 1000, s0 + msPerPx);
        segX[best].push(s0, e0, NaN); segY[best].push(L, L, NaN);
        hx[best].push((s0 + e0) / 2); hy[best].push(L);
        ht[best].push(bN === 1 ? kernelText(bLong) : bN + ' ops merged (zoom in) · busy ' + fmtDur(busy.reduce(function (u, v) { return u + v; }, 0)) +
                      '<br>longest: ' + kernelText(bLong));
        for (q = 0; q < NC; q++) busy[q] = 0;
        if (bS < rhi && bE > rlo) { inView += 1; inViewOps += bN; }
        merged += bN > 1 ? bN : 0; drawn += 1; bN = 0; bLong = -1;
      };
      for (var j = lo2; j < b; j++) {
        var st = ks[j], du = kd[j];
        if (st > vhi) break;
        if (st + du < vlo) continue;
        var sMs = x0 + st / 1000;
        if (du / 1000 >= MIN_PX * msPerPx) {
          var e1 = sMs + du / 1000, cc = kc[j];
          segX[cc].push(sMs, e1, NaN); segY[cc].push(L, L, NaN);
          hx[cc].push(sMs + du / 2000); hy[cc].push(L); ht[cc].push(kernelText(j));
          drawn += 1;
          if (st < rhi && st + du > rlo) { inView += 1; inViewOps += 1; }
          continue;
        }
        var cl = Math.floor((sMs - lo) / msPerPx);
        if (cl !== col) { flush(); col = cl; bS = st; bE = st + du; }
        busy[kc[j]] += du; bN += 1; if (st + du > bE) bE = st + du;
        if (bLong < 0 || du > kd[bLong]) bLong = j;
      }
      flush();
    }
    STATUS.lod = {drawn: drawn, merged: merged, in_view: inView, in_view_ops: inViewOps};
    return {segX: segX, segY: segY, hx: hx, hy: hy, ht: ht};
  }
  // names on the segments once zoomed in far enough (>= LABEL_PX wide): at most MAX_LABELS, widest first
  var LABEL_PX = 70, MAX_LABELS = 300, CH_PX = 6.3;
  function unesc(t) { return t.replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&#34;/g, '"').replace(/&#39;/g, "'").replace(/&amp;/g, '&'); }
  function labelsFor(lo, hi) {
    var plotW = (gd._fullLayout && gd._fullLayout._size) ? gd._fullLayout._size.w : Math.max(400, gd.clientWidth - 164);
    var msPerPx = (hi - lo) / Math.max(plotW, 100), minUs = LABEL_PX * msPerPx * 1000;
    var vlo = (lo - x0) * 1000, vhi = (hi - x0) * 1000, cand = [], L, j;
    for (L = 0; L < nLanes && cand.length < 20000; L++) {
      var a = laneLo[L], b = laneLo[L + 1], lo2 = a, hi2 = b, target = vlo - maxDur;
      while (lo2 < hi2) { var m = (lo2 + hi2) >> 1; if (ks[m] < target) lo2 = m + 1; else hi2 = m; }
      for (j = lo2; j < b; j++) {
        if (ks[j] > vhi) break;
        // a collective's name sits on its transfer (the wait before it is covered by the wait overlay); when only
        // the wait is in view, on the wait, in black (the overlay is a light colour)
        var w0 = collOf && collOf[j] >= 0 ? Math.min(cw[collOf[j]], kd[j]) : 0;
        var vs = Math.max(ks[j] + w0, vlo), ve = Math.min(ks[j] + kd[j], vhi);
        if (ve - vs >= minUs) { cand.push([j, ve - vs, vs, ve, false]); continue; }
        var ws = Math.max(ks[j], vlo), we = Math.min(ks[j] + w0, vhi);
        if (w0 > 0 && we - ws >= minUs) cand.push([j, we - ws, ws, we, true]);
      }
    }
    cand.sort(function (p, q) { return q[1] - p[1]; });
    var lx = [], ly = [], lt = [], lc = [];
    cand.slice(0, MAX_LABELS).forEach(function (c) {
      var nch = Math.floor(c[1] / 1000 / msPerPx / CH_PX) - 1, nm = unesc(D.names[kn[c[0]]]);
      if (nch < 4) return;
      if (nm.length > nch) nm = nm.slice(0, nch - 1) + '…';
      // WebGL text is drawn on the canvas (never parsed as HTML): the name as it is, in black or white,
      // whichever contrasts more with its segment's colour (WCAG AA, palette.text_color_on)
      lx.push(x0 + (c[2] + c[3]) / 2000); ly.push(kl[c[0]]); lt.push(nm); lc.push(c[4] ? '#000000' : LABEL_COLORS[kc[c[0]]]);
    });
    STATUS.labels = lt.length;
    STATUS.label_colors = lc.slice(0, 50);
    return {x: lx, y: ly, text: lt, color: lc};
  }
  var catTrace = [];
  var lod0 = buildLOD(VIEW0, VIEW1);
  // initial view: segments drawn that intersect it, and the ops they stand for (merged sub-pixel ops included)
  STATUS.view = {x0_ms: VIEW0, x1_ms: VIEW1, segments: STATUS.lod.in_view, ops: STATUS.lod.in_view_ops};
  for (var c = 0; c < NC; c++) {
    catTrace.push(traces.length);
    traces.push(segTrace(ax, lod0.segX[c], lod0.segY[c], COLORS[c], LW, CATS[c], 'cat' + c, true));
    traces.push(hoverTrace(ax, lod0.hx[c], lod0.hy[c], lod0.ht[c], COLORS[c], 'cat' + c, LW));
  }
  var labelTrace = -1;
  window.tkTimeline.labelsFor = labelsFor;
  var busyLOD = false, labelsShown = false, boxTimer = null;
  window.tkTimeline.relod = function (first) {
    var xa = gd._fullLayout[ax.x.replace('x', 'xaxis')];
    if (!xa || busyLOD) return Promise.resolve();
    var r = xa.range, upd = {x: [], y: [], text: []}, idx = [];
    if (LOD_ON && !first) {
      var lod = buildLOD(r[0], r[1]);
      for (var c3 = 0; c3 < NC; c3++) {
        var ti = catTrace[c3];
        idx.push(ti, ti + 1);
        upd.x.push(lod.segX[c3], lod.hx[c3]); upd.y.push(lod.segY[c3], lod.hy[c3]); upd.text.push(null, lod.ht[c3]);
      }
    }
    var lb = labelsFor(r[0], r[1]), names = null;
    if (lb.text.length || labelsShown) {  // restyle the names only when there are (or were) any
      names = {x: [lb.x], y: [lb.y], text: [lb.text], 'textfont.color': [lb.color.length ? lb.color : '#000000']};
      labelsShown = lb.text.length > 0;
    }
    if (window.tkTimeline.boxShape !== undefined && ovAx && !first) {
      // the overview's box follows the detail view, once the zooming pauses (a relayout of its own)
      clearTimeout(boxTimer);
      boxTimer = setTimeout(function () {
        var lay = {}, xr = gd._fullLayout[ax.x.replace('x', 'xaxis')].range;
        lay['shapes[' + window.tkTimeline.boxShape + '].x0'] = xr[0]; lay['shapes[' + window.tkTimeline.boxShape + '].x1'] = xr[1];
        Plotly.relayout(gd, lay);
      }, 400);
    }
    if (!idx.length && !names) return Promise.resolve();
    busyLOD = true;
    var p0 = idx.length ? Plotly.restyle(gd, upd, idx) : Promise.resolve();
    return p0.then(function () { return names ? Plotly.restyle(gd, names, [labelTrace]) : null; })
             .then(function () { busyLOD = false; }, function (e) { busyLOD = false; throw e; });
  };
  window.tkTimeline.detailKey = ax.x.replace('x', 'xaxis');
  STATUS.segments += n;
  // collective wait overlay + links
  if (C) {
    var wi = [], wstart = new Float32Array(C.n), wdur = new Float32Array(C.n), wl = new Uint16Array(C.n);
    var cidx2 = dec(C.idx);
    for (i = 0; i < C.n; i++) {
      k = cidx2[i];
      if (cw[i] > 0) { wi.push(i); wstart[i] = ks[k]; wdur[i] = Math.min(cw[i], kd[k]); wl[i] = kl[k]; }
    }
    if (wi.length > (C.max_waits || 5000)) {  // the longest waits only (each overlay costs GL points)
      wi.sort(function (a, b) { return wdur[b] - wdur[a]; });
      wi = wi.slice(0, C.max_waits || 5000);
    }
    if (wi.length) {
      var wsg = segments(wi, wstart, wdur, wl, x0);
      traces.push(segTrace(ax, wsg[0], wsg[1], '#f4b6b0', LW, 'collective wait', 'cwait', true));
    }
    if (C.link_x) {
      var lx = dec(C.link_x), ll = dec(C.link_lanes), ln = dec(C.link_len), total = 0;
      for (i = 0; i < ln.length; i++) total += ln[i] + 1;
      var xs = new Float64Array(total), ys = new Float64Array(total), p = 0, o = 0;
      for (i = 0; i < ln.length; i++) {
        for (var j = 0; j < ln[i]; j++) { xs[p] = x0 + lx[i] / 1000; ys[p] = ll[o + j]; p++; }
        o += ln[i]; xs[p] = NaN; ys[p] = NaN; p++;
      }
      traces.push({type: 'scattergl', mode: 'lines', x: xs, y: ys, xaxis: ax.x, yaxis: ax.y, hoverinfo: 'skip',
                   line: {color: 'rgba(110,0,0,0.55)', width: 1}, name: 'collective link (release)',
                   legendgroup: 'clink', showlegend: true});
    }
  }
  // the names on the segments, last on the WebGL canvas so no overlay (collective waits, links) covers them
  labelTrace = traces.length;
  traces.push({type: 'scattergl', mode: 'text', x: [], y: [], text: [], xaxis: ax.x, yaxis: ax.y,
               textfont: {size: 10, color: '#000000'}, hoverinfo: 'skip', showlegend: false, name: 'names'});
  // stalls
  if (D.stalls.length) {
    var tx = [], ty = [], tt = [], lx2 = [], ly2 = [];
    D.stalls.forEach(function (s) {
      if (s.rank !== null && !(s.rank in firstLane)) return;
      var y = s.rank === null ? 0 : firstLane[s.rank], xs0 = x0 + s.s / 1000, xe = xs0 + s.d / 1000;
      tx.push(xs0); ty.push(y - 0.35);
      tt.push('stall · ' + s.label + (s.rank !== null ? ' · rank ' + s.rank : '') + '<br>' + fmtDur(s.d) +
              (s.detail ? '<br>' + s.detail : ''));
      lx2.push(xs0, xe, null); ly2.push(y - 0.35, y - 0.35, null);
    });
    traces.push({type: 'scatter', mode: 'lines', x: lx2, y: ly2, xaxis: ax.x, yaxis: ax.y, hoverinfo: 'skip',
                 line: {color: '#000', width: 3}, name: 'stall', legendgroup: 'stall', showlegend: false});
    traces.push({type: 'scatter', mode: 'markers', x: tx, y: ty, text: tt, hovertemplate: '%{text}<extra></extra>',
                 marker: {symbol: 'triangle-down', size: 10, color: '#000'}, xaxis: ax.x, yaxis: ax.y,
                 name: 'stall', legendgroup: 'stall', showlegend: true});
  }
}

STATUS.traces = traces.length;
window.tkTimeline.detailAxis = detAx;
window.tkTimeline.overviewAxis = ovAx;
// detail-lane positions {x (ms), y (lane)} of the ops whose (escaped) name is `name` (tests, console use)
window.tkTimeline.opsNamed = function (name) {
  var K = D.kernels, code = D.names.indexOf(name), out = [];
  if (code < 0) return out;
  var kn = dec(K.name), ks = dec(K.start), kd = dec(K.dur), kl = dec(K.lane);
  for (var i = 0; i < K.n; i++) if (kn[i] === code) out.push({x: D.x0_ms + (ks[i] + kd[i] / 2) / 1000, y: kl[i]});
  return out;
};

// after a zoom: tick values and labels of every time axis for its new range (timeTicks)
function retick() {
  var fl = gd._fullLayout, upd = {}, any = false, w = fl && fl._size ? fl._size.w : PLOT_W;
  Object.keys(fl || {}).forEach(function (key) {
    if (!/^xaxis\d*$/.test(key)) return;
    var xa = fl[key];
    if (!xa || xa.showticklabels === false || !xa.range) return;
    var t = timeTicks(xa.range[0], xa.range[1], w), cur = xa.tickvals;
    if (!t || (cur && cur.length === t.tickvals.length && cur[0] === t.tickvals[0] && cur[cur.length - 1] === t.tickvals[t.tickvals.length - 1])) return;
    upd[key + '.tickmode'] = 'array'; upd[key + '.tickvals'] = t.tickvals; upd[key + '.ticktext'] = t.ticktext; any = true;
  });
  return any ? Plotly.relayout(gd, upd) : null;
}
window.tkTimeline.retick = retick;
window.tkTimeline.timeTicks = timeTicks;

function flushGL() {
  // wait for the WebGL raster to finish (readPixels blocks until the GPU / SwiftShader is done)
  var gc = gd._fullLayout && gd._fullLayout._glcanvas, px = new Uint8Array(4);
  if (gc && gc.each) gc.each(function (d) {
    var g = d && d.regl && d.regl._gl;
    if (g) g.readPixels(0, 0, 1, 1, g.RGBA, g.UNSIGNED_BYTE, px);
  });
}
function zoomSteps(axName, lo, hi, n) {
  // n programmatic zoom steps on one axis; per step [relayout ms, relayout + raster ms]
  var out = [], chain = Promise.resolve(), mid = (lo + hi) / 2, half = (hi - lo) / 2;
  for (var i = 1; i <= n; i++) {
    (function (f) {
      chain = chain.then(function () {
        var t = performance.now(), upd = {};
        upd[axName + '.range'] = [mid - half * f, mid + half * f];
        return Plotly.relayout(gd, upd).then(function () { return window.tkTimeline.pending; }).then(function () {
          var t1 = performance.now(); flushGL(); out.push([t1 - t, performance.now() - t]);
        });
      });
    })(i % 2 === 1 ? Math.pow(0.5, (i + 1) / 2) : Math.pow(0.5, i / 2 - 1) * 0.75);
  }
  return chain.then(function () {
    var upd = {}; upd[axName + '.range'] = [lo, hi];
    return Plotly.relayout(gd, upd);
  }).then(function () { return out; });
}
window.tkTimeline.zoomSteps = zoomSteps;

// window chooser (profiler windows, steps, stalls): zooms the detail lanes, or names the --window to re-run with
function zoomDetail(a, b) {
  if (!detAx) return;
  var upd = {};
  upd[detAx.x.replace('x', 'xaxis') + '.range'] = [a, b];
  Plotly.relayout(gd, upd);
}
var chooser = document.getElementById('tk-chooser');
if (chooser) chooser.addEventListener('change', function () {
  var opt = chooser.options[chooser.selectedIndex], note = document.getElementById('tk-chooser-note');
  if (!opt) return;
  var a = parseFloat(opt.getAttribute('data-t0')), b = parseFloat(opt.getAttribute('data-t1'));
  if (!(isFinite(a) && isFinite(b))) return;
  if (opt.getAttribute('data-inside') !== '1') {
    if (note) note.textContent = 'not embedded in this page: re-run with ' + opt.getAttribute('data-flag');
    return;
  }
  if (note) note.textContent = opt.getAttribute('data-flag');
  var pad = (b - a) * 0.02;
  zoomDetail(Math.max(a - pad, D.x0_ms), Math.min(b + pad, D.x1_ms));
});
// click on the overview: centre the detail lanes there (same zoom width) when that time is embedded
function hookOverviewClick() {
  if (!gd.on || !ovAx || !detAx) return;
  gd.on('plotly_click', function (ev) {
    var p = ev && ev.points && ev.points[0];
    if (!p || p.xaxis === undefined || p.xaxis._id !== 'x') return;
    var t = p.x, xa = gd._fullLayout[detAx.x.replace('x', 'xaxis')], w = xa.range[1] - xa.range[0];
    if (t < D.x0_ms || t > D.x1_ms) return;
    zoomDetail(t - w / 2, t + w / 2);
  });
}

// tables that jump to the timeline
document.addEventListener('click', function (ev) {
  var tr = ev.target && ev.target.closest ? ev.target.closest('tr.jump') : null;
  if (!tr || !detAx) return;
  var a = parseFloat(tr.getAttribute('data-t0')), b = parseFloat(tr.getAttribute('data-t1'));
  if (!(isFinite(a) && isFinite(b))) return;
  var note = document.getElementById('tk-jump-note');
  if (b < D.x0_ms || a > D.x1_ms) {
    if (note) note.textContent = 'outside the detail window; re-run with the --window shown in the row';
    return;
  }
  if (note) note.textContent = '';
  var pad = Math.max((b - a) * 0.5, 0.05), upd = {};
  upd[detAx.x.replace('x', 'xaxis') + '.range'] = [a - pad, b + pad];
  Plotly.relayout(gd, upd);
  gd.scrollIntoView({block: 'start'});
});

try {
  Plotly.newPlot(gd, traces, layout, {displaylogo: false, responsive: true,
                                       modeBarButtonsToRemove: ['select2d', 'lasso2d']}).then(function () {
    window.tkTimeline.pending = window.tkTimeline.relod ? window.tkTimeline.relod(true) : Promise.resolve();
    hookOverviewClick();
    gd.on('plotly_relayout', function (ev) {
      if (!ev || !Object.keys(ev).some(function (k2) { return /^xaxis\d*\.(range|autorange)/.test(k2); })) return;
      window.tkTimeline.pending = Promise.resolve(window.tkTimeline.pending).then(retick);
    });
    if (window.tkTimeline.relod) {
      var key = window.tkTimeline.detailKey;
      gd.on('plotly_relayout', function (ev) {
        if (!ev) return;
        var hit = false;
        Object.keys(ev).forEach(function (k2) { if (k2.indexOf(key + '.range') === 0 || k2 === key + '.autorange') hit = true; });
        if (hit) window.tkTimeline.pending = window.tkTimeline.relod();
      });
    }
    flushGL();
    STATUS.render_ms = performance.now();
    STATUS.script_ms = performance.now() - T0;
    STATUS.ok = STATUS.errors.length === 0;
    writeStatus();
    if (location.hash.indexOf('bench') >= 0 && detAx) {
      var dx = detAx.x.replace('x', 'xaxis');
      return zoomSteps(dx, D.x0_ms, D.x1_ms, 6).then(function (z) {
        STATUS.zoom_ms = z;
        return ovAx ? zoomSteps('xaxis', 0, P.span_ms, 6) : [];
      }).then(function (z2) { STATUS.zoom_overview_ms = z2; STATUS.bench_done = true; writeStatus(); });
    }
  }).catch(function (e) { fail('plot: ' + (e && e.message ? e.message : e)); });
} catch (e) { fail('plot: ' + (e && e.message ? e.message : e)); }
})();
"""
