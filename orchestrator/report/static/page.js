(function(){
const data = JSON.parse(document.getElementById('page-data').textContent);
const COLORS = {clear:'#15803d', none:'#6b7280', untested:'#b45309'};
const fmt = (x, d) => x === null || x === undefined ? '-' : (Math.abs(x) >= 100 ? Math.round(x).toLocaleString('en') : Number(x.toPrecision(d || 3)).toString());
const verdictClass = e => e.significant ? 'clear' : (e.significant === false ? 'none' : 'untested');
const esc = s => String(s).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
let runs = null;
const rowOf = new Map();

async function loadRuns(){
  const b64 = document.getElementById('runs-data').textContent.trim();
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
  runs = await new Response(stream).json();
  runs.cols.run_id.forEach((id, i) => rowOf.set(id, i));
}

function runHover(id){
  const i = rowOf.get(id);
  if (i === undefined) return 'run ' + id;
  const c = runs.cols;
  return 'run ' + id + ' · pass ' + c.pass[i] + (c.disturbed[i] ? ' · disturbed' : '') + '<br>' + esc(runs.dicts.config[c.config[i]]) +
    '<br>step ' + fmt(c.step_ms[i], 4) + ' ms · ' + fmt(c.tokens_per_s[i], 4) + ' tokens/s · MFU ' + fmt(c.mfu[i], 2);
}

const layoutBase = {margin:{l:60,r:20,t:10,b:45}, font:{size:12}, hovermode:'closest', showlegend:true,
  legend:{orientation:'h', y:-0.25}};
const config = {displaylogo:false, responsive:true};

function forest(div){
  const es = data.effects;
  const n = es.length;
  const y = es.map((e, i) => n - i);
  const cut = s => s.length > 48 ? s.slice(0, 47) + '…' : s;
  const label = e => cut((data.several ? e.machine.split(' (')[0] + ' · ' : '') + e.label);
  const traces = [];
  for (const cls of ['clear', 'none', 'untested']){
    const idx = es.map((e, i) => i).filter(i => verdictClass(es[i]) === cls);
    if (!idx.length) continue;
    traces.push({type:'scatter', mode:'markers', name:{clear:'clear effect', none:'no detectable effect', untested:'not tested, or unresolved (too few runs)'}[cls],
      x: idx.map(i => es[i].factor), y: idx.map(i => y[i]),
      customdata: idx.map(i => es[i].anchor),
      error_x: {type:'data', symmetric:false, array: idx.map(i => es[i].factor_hi === null ? 0 : es[i].factor_hi - es[i].factor),
        arrayminus: idx.map(i => es[i].factor_lo === null ? 0 : es[i].factor - es[i].factor_lo), color: COLORS[cls], thickness:1.5, width:3},
      marker:{color: COLORS[cls], size: idx.map(i => es[i].headline ? 9 : 6), symbol: idx.map(i => es[i].kind === 'elasticity' ? 'diamond' : 'circle')},
      text: idx.map(i => esc(label(es[i])) + '<br>' + esc(es[i].describe) + '<br>' + es[i].verdict + ' · adjusted p ' + (es[i].p_adjusted === null ? '-' : fmt(es[i].p_adjusted, 2)) + ' · ' + es[i].n_runs + ' runs'),
      hovertemplate: '%{text}<extra></extra>'});
  }
  const height = Math.max(220, 60 + 17 * n);
  const fs = es.flatMap(e => [e.factor, e.factor_lo, e.factor_hi]).filter(x => x !== null && x > 0);
  const lo = Math.floor(Math.log2(Math.min(...fs, 0.9))), hi = Math.ceil(Math.log2(Math.max(...fs, 1.1)));
  const ticks = []; for (let k = lo; k <= hi; k++) { ticks.push(Math.pow(2, k)); if (hi - lo <= 3 && k < hi) ticks.push(Math.pow(2, k + 0.5)); }
  Plotly.newPlot(div, traces, Object.assign({}, layoutBase, {height: height, margin:{l:330, r:20, t:10, b:40},
    xaxis:{type:'log', title:{text:'step-time factor (ratio vs baseline; power laws per doubling), log scale'}, zeroline:false,
      tickvals: ticks, ticktext: ticks.map(t => t >= 1 ? (+t.toPrecision(2)) + 'x' : '1/' + (+(1 / t).toPrecision(2)) + 'x')},
    yaxis:{tickvals: y, ticktext: es.map(e => label(e)), range:[0.3, n + 0.7], automargin:false},
    shapes:[{type:'line', x0:1, x1:1, yref:'paper', y0:0, y1:1, line:{color:'#999', dash:'dot'}}],
    legend:{orientation:'h', y:1.02, yanchor:'bottom'}}), config);
  div.on('plotly_click', ev => { const a = ev.points[0].customdata; if (a) location.hash = '#' + a; });
}

function jitter(k){ const s = Math.sin(k * 12.9898) * 43758.5453; return (s - Math.floor(s)) - 0.5; }

function variable(div){
  const v = data.variables[+div.dataset.index];
  const numeric = v.size_like && v.levels.every(l => l.value !== null && l.value > 0);
  const traces = [];
  const xs = [], ys = [], hover = [];
  v.levels.forEach((lv, li) => {
    lv.run_ids.forEach((id, k) => {
      const i = rowOf.get(id);
      const y = i === undefined ? null : runs.cols.step_ms[i];
      xs.push(numeric ? lv.value * Math.exp(0.06 * jitter(id)) : li + 0.5 * jitter(id));
      ys.push(y); hover.push(runHover(id));
    });
  });
  traces.push({type: xs.length > 3000 ? 'scattergl' : 'scatter', mode:'markers', name:'runs', x:xs, y:ys, text:hover,
    hovertemplate:'%{text}<extra></extra>', marker:{size:6, color:'rgba(37,99,235,0.45)', line:{width:0}}});
  const base = v.levels.find(l => l.baseline);
  if (numeric && v.law){
    const vals = v.levels.map(l => l.value), lx = vals.map(Math.log);
    const ly = v.levels.map(l => Math.log(l.geo_ms));
    const mx = lx.reduce((a, b) => a + b) / lx.length, my = ly.reduce((a, b) => a + b) / ly.length;
    const lo = Math.min(...vals), hi = Math.max(...vals);
    const grid = Array.from({length: 30}, (_, k) => lo * Math.pow(hi / lo, k / 29));
    const line = e => grid.map(x => Math.exp(my + e * (Math.log(x) - mx)));
    if (v.law.lo !== null){
      traces.push({type:'scatter', mode:'lines', x:grid, y:line(v.law.hi), line:{width:0}, showlegend:false, hoverinfo:'skip'});
      traces.push({type:'scatter', mode:'lines', x:grid, y:line(v.law.lo), line:{width:0}, fill:'tonexty',
        fillcolor:'rgba(220,38,38,0.12)', name:'exponent interval', hoverinfo:'skip'});
    }
    traces.push({type:'scatter', mode:'lines', x:grid, y:line(v.law.estimate), name:'fitted: step time ~ ' + v.variable + '^' + v.law.estimate.toFixed(2),
      line:{color:'#dc2626', width:2}, hoverinfo:'name'});
  }
  const rx = [], ry = [], up = [], down = [], rt = [];
  v.levels.forEach((lv, li) => {
    const r = lv.ratio;
    const x = numeric ? lv.value : li;
    if (lv.baseline){ rx.push(x); ry.push(base.geo_ms); up.push(0); down.push(0); rt.push(esc(lv.label) + ' (baseline): ' + fmt(base.geo_ms, 4) + ' ms, ' + lv.n + ' runs'); return; }
    if (!r) return;
    const y = base.geo_ms * r.estimate;
    rx.push(x); ry.push(y);
    up.push(r.hi === null ? 0 : base.geo_ms * r.hi - y); down.push(r.lo === null ? 0 : y - base.geo_ms * r.lo);
    rt.push(esc(lv.label) + ' vs ' + esc(v.baseline) + ': ' + r.estimate.toFixed(3) + 'x' + (r.lo === null ? ' (no interval)' : ' [' + r.lo.toFixed(2) + ', ' + r.hi.toFixed(2) + ']') + '<br>' + r.verdict + ' · ' + lv.n + ' runs');
  });
  traces.push({type:'scatter', mode:'markers', name:'fitted ratio vs baseline (family-wise 95%)', x:rx, y:ry, text:rt, hovertemplate:'%{text}<extra></extra>',
    marker:{symbol:'diamond', size:11, color:'#111827'}, error_y:{type:'data', symmetric:false, array:up, arrayminus:down, color:'#111827', thickness:1.5}});
  const xaxis = numeric ? {type:'log', zeroline:false, title:{text:v.variable}, tickvals:v.levels.map(l => l.value), ticktext:v.levels.map(l => l.label)}
                        : {zeroline:false, title:{text:v.variable}, tickvals:v.levels.map((l, i) => i), ticktext:v.levels.map(l => l.label), range:[-0.7, v.levels.length - 0.3]};
  Plotly.newPlot(div, traces, Object.assign({}, layoutBase, {height:340, xaxis:xaxis, yaxis:{type:'log', title:{text:'median step time (ms)'}}}), config);
}

function grid(div){
  const g = data.grids[+div.dataset.index];
  const traces = g.row_labels.map((r, i) => ({type:'scatter', mode:'lines+markers', name:g.rows + '=' + r,
    x:g.col_labels, y:g.step_ms[i], connectgaps:false, hovertemplate:g.rows + '=' + esc(r) + ', ' + g.cols + '=%{x}: %{y:.4g} ms<extra></extra>'}));
  Plotly.newPlot(div, traces, Object.assign({}, layoutBase, {height:320, xaxis:{type:'category', title:{text:g.cols}},
    yaxis:{type:'log', title:{text:'median step time (ms)'}}, legend:{orientation:'v'}}), config);
}

function shared(div){
  const traces = data.shared.pairs.map(p => ({type: p.x.length > 3000 ? 'scattergl' : 'scatter', mode:'markers',
    name:(data.names[p.other] || p.other) + ' vs ' + (data.names[p.ref] || p.ref), x:p.x, y:p.y,
    hovertemplate:'%{x:.4g} ms vs %{y:.4g} ms<extra></extra>', marker:{size:6, opacity:0.6}}));
  const all = data.shared.pairs.flatMap(p => p.x.concat(p.y)).filter(v => v > 0);
  const lo = Math.min(...all) * 0.8, hi = Math.max(...all) * 1.25;
  traces.push({type:'scatter', mode:'lines', x:[lo, hi], y:[lo, hi], name:'equally fast', line:{dash:'dot', color:'#999'}, hoverinfo:'skip'});
  const ref = data.names[data.shared.pairs[0].ref] || 'reference';
  Plotly.newPlot(div, traces, Object.assign({}, layoutBase, {height:420, xaxis:{type:'log', title:{text:'step time on ' + ref + ' (ms)'}},
    yaxis:{type:'log', title:{text:'step time on the other machine (ms)'}}}), config);
}

const DRAW = {forest, variable, grid, shared};
const drawn = new WeakSet();
function draw(div){
  if (drawn.has(div)) return;
  drawn.add(div);
  DRAW[div.dataset.plot](div);
}
function renderAll(){ document.querySelectorAll('.plot').forEach(draw); }

// -- the runs table: filter, sort and paginate over the columns, one page of DOM rows at a time
const state = {status:'', variable:'', text:'', key:'run_id', dir:1, page:0};
let order = [];
function applyFilter(){
  const c = runs.cols, d = runs.dicts;
  const st = state.status === '' ? -1 : d.status.indexOf(state.status);
  const okConfig = d.config.map((text, i) => (state.variable === '' || runs.config_vars[i].includes(state.variable)) &&
    (state.text === '' || text.toLowerCase().includes(state.text.toLowerCase())));
  const out = [];
  for (let i = 0; i < runs.n; i++) if ((st < 0 || c.status[i] === st) && okConfig[c.config[i]]) out.push(i);
  const col = c[state.key], dir = state.dir;
  const textual = {machine:d.machine, status:d.status, config:d.config, reason:d.reason}[state.key];
  out.sort((a, b) => {
    let x = textual ? textual[col[a]] : col[a], y = textual ? textual[col[b]] : col[b];
    if (x === null) return 1; if (y === null) return -1;
    return (x < y ? -1 : x > y ? 1 : c.run_id[a] - c.run_id[b]) * dir;
  });
  order = out;
  state.page = 0;
  renderRuns();
}
function renderRuns(){
  const c = runs.cols, d = runs.dicts, per = data.per_page;
  const pages = Math.max(1, Math.ceil(order.length / per));
  state.page = Math.min(state.page, pages - 1);
  const rows = order.slice(state.page * per, (state.page + 1) * per).map(i =>
    '<tr data-status="' + esc(d.status[c.status[i]]) + '"><td>' + c.run_id[i] + '</td><td>' + esc(d.machine[c.machine[i]]) + '</td><td>' + esc(d.status[c.status[i]]) +
    (c.disturbed[i] ? ' (disturbed)' : '') + '</td><td>' + c.pass[i] + '</td><td class="config">' + esc(d.config[c.config[i]]) + '</td><td>' + fmt(c.step_ms[i], 4) +
    '</td><td>' + fmt(c.tokens_per_s[i], 4) + '</td><td>' + fmt(c.mfu[i], 2) + '</td><td>' + esc(d.reason[c.reason[i]]) + '</td></tr>');
  document.querySelector('#runs-table tbody').innerHTML = rows.join('');
  document.getElementById('runs-count').textContent = order.length.toLocaleString('en') + ' of ' + runs.n.toLocaleString('en') + ' runs';
  document.getElementById('p-page').textContent = 'page ' + (state.page + 1) + ' of ' + pages;
}
function wireRuns(){
  const on = (id, ev, f) => document.getElementById(id).addEventListener(ev, f);
  on('f-status', 'change', e => { state.status = e.target.value; applyFilter(); });
  on('f-variable', 'change', e => { state.variable = e.target.value; applyFilter(); });
  on('f-text', 'input', e => { state.text = e.target.value; applyFilter(); });
  on('p-prev', 'click', () => { state.page = Math.max(0, state.page - 1); renderRuns(); });
  on('p-next', 'click', () => { state.page += 1; renderRuns(); });
  document.querySelectorAll('#runs-table th').forEach(th => th.addEventListener('click', () => {
    const key = th.dataset.key;
    state.dir = state.key === key ? -state.dir : 1; state.key = key; applyFilter();
  }));
  applyFilter();
}
document.querySelectorAll('table.effects tbody tr').forEach(tr => tr.addEventListener('click', ev => {
  const a = tr.querySelector('a'); if (a && ev.target.tagName !== 'A') location.hash = a.getAttribute('href');
}));

const ready = loadRuns().then(() => {
  wireRuns();
  const io = new IntersectionObserver(entries => entries.forEach(en => { if (en.isIntersecting) draw(en.target); }), {rootMargin:'400px'});
  document.querySelectorAll('.plot').forEach(div => io.observe(div));
  const first = document.querySelector('[data-plot="forest"]');
  if (first) draw(first);
  window.cpubench.loadMs = performance.now();
  document.body.dataset.ready = '1';
  if (location.hash === '#print' || (window.matchMedia && window.matchMedia('print').matches)) printReady();
});
// Printing (and a headless PDF or screenshot) shows only what is drawn: draw every plot first.
function printReady(){ renderAll(); document.body.dataset.printed = '1'; }
window.addEventListener('beforeprint', () => { if (runs) printReady(); });
if (window.matchMedia) window.matchMedia('print').addEventListener('change', e => { if (e.matches && runs) printReady(); });
window.cpubench = {ready, renderAll, printReady, state, applyFilter, runs: () => runs, order: () => order};
})();
