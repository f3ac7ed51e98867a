// hybridrl report / dashboard page. Data: window.HYBRIDRL_DATA (a report) or polled from
// window.HYBRIDRL_LIVE.url (the dashboard: the whole data once, then only what changed since the
// cursor of the last answer). Charts: uPlot. No network access otherwise.
// Many runs: the run list filters by name and status; the charts, the summary and the timing
// overlay only the selected runs (at most MAX_COMPARE), so the page's height does not grow with
// the number of runs.
(function () {
  "use strict";
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const DASHES = [[], [6, 4], [2, 3], [10, 3, 2, 3]];
  const PAGE = 10;
  const MAX_COMPARE = 10, DEFAULT_COMPARE = 5;
  const CURVES = [
    { id: "reward", title: "Training reward", keys: ["critic/score/mean", "rewards/accuracies", "mean_token_accuracy"] },
    { id: "val", title: "Validation scores", match: (k) => k.startsWith("val-core/") || k.startsWith("val/") },
    { id: "kl", title: "KL", keys: ["actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl", "kl"] },
    { id: "entropy", title: "Entropy", keys: ["actor/entropy"] },
    { id: "groups", title: "Prompts whose samples all scored alike (no group-relative signal; all at the top score)",
      keys: ["critic/groups/no_signal_frac", "critic/groups/all_top_frac", "train/generated/no_signal_frac", "train/generated/all_top_frac"] },
    { id: "resp_len", title: "Response length (mean)", keys: ["response_length/mean"] },
    { id: "clip_ratio", title: "Response length clip ratio (share hitting max_response_length)", keys: ["response_length/clip_ratio"] },
    { id: "grad_norm", title: "Grad norm", keys: ["actor/grad_norm", "critic/grad_norm"] },
    { id: "clipfrac", title: "Clip fractions", keys: ["actor/pg_clipfrac", "actor/pg_clipfrac_lower", "critic/vf_clipfrac"] },
    { id: "per_source", title: "Scores per data source and reward parts",
      match: (k) => (/^critic\/score\/.+\/mean$/.test(k) && k !== "critic/score/mean") || /^reward\/.+\/mean$/.test(k) },
    { id: "loss", title: "Losses", keys: ["actor/pg_loss", "critic/vf_loss", "loss"] },
    { id: "margins", title: "Preference margins", keys: ["rewards/margins"] },
    { id: "lr", title: "Learning rate", keys: ["actor/lr", "critic/lr"] },
  ];
  const PERF = [
    { id: "throughput", title: "Throughput (tokens/s)", keys: ["perf/throughput", "perf/rollout_tokens_per_s"] },
    { id: "mfu", title: "MFU", keys: ["perf/mfu/actor", "perf/mfu/critic"] },
    { id: "memory", title: "Peak device memory (GB)", keys: ["perf/max_memory_allocated_gb"] },
    { id: "step_time", title: "Step time (s)", keys: ["timing_s/step"] },
  ];

  let DATA = window.HYBRIDRL_DATA || { runs: [] };
  const LIVE = window.HYBRIDRL_LIVE;
  let plots = [];
  let polls = 0, cursor = null;
  const sent = [];  // bytes of each answer (the browser test reads them)
  const H0 = readHash();
  // the run list: name filter, status filter, the runs compared (null: not chosen yet)
  const list = { filter: H0.filter || "", status: H0.status || "all", compare: H0.compare !== undefined ? H0.compare.split(",").filter((n) => n) : null };
  const insp = Object.assign({ run: 0, kind: "all", step: "all", src: "", min: "", max: "", q: "", sort: "step", page: 1 }, H0);
  for (const k of ["filter", "status", "compare"]) delete insp[k];
  const loadingSamples = {};
  let inspChosen = H0.run !== undefined;
  const diffOpen = {};

  // ---------------------------------------------------------------- helpers
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "html") e.innerHTML = v;
      else if (v !== null && v !== undefined) e.setAttribute(k, v);
    }
    for (const c of kids.flat()) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
    return String(Number(v.toPrecision(4)));
  }
  function axisFmt(v) {  // tick labels: 150k, 2.5M
    const a = Math.abs(v);
    if (a >= 1e6) return fmt(v / 1e6) + "M";
    if (a >= 1e4) return fmt(v / 1e3) + "k";
    return fmt(v);
  }
  function dur(s) {
    if (s === null || s === undefined) return "–";
    s = Math.round(s);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  }
  function color(i) { return COLORS[i % COLORS.length]; }
  function compared() {
    if (list.compare === null) {  // by default: every run, or the most recently written few
      const runs = DATA.runs.slice();
      if (runs.length > MAX_COMPARE) runs.sort((a, b) => age(a) - age(b));
      return runs.slice(0, runs.length > MAX_COMPARE ? DEFAULT_COMPARE : MAX_COMPARE).map((r) => r.name);
    }
    return list.compare;
  }
  function colorOf(name) { const i = compared().indexOf(name); return color(i < 0 ? 0 : i); }
  // the compared runs whose curves are here (the dashboard loads a run's curves once it is compared)
  function visibleRuns() { const sel = compared(); return DATA.runs.map((r, i) => [r, i]).filter(([r]) => sel.includes(r.name) && r.series); }
  function age(r) {  // seconds since the run last wrote, as of now
    const s = r.summary || {};
    if (s.updated_age_s === null || s.updated_age_s === undefined) return Infinity;
    return s.updated_age_s + (r._received ? (Date.now() - r._received) / 1000 : 0);
  }
  function statusOf(r) {
    const s = r.summary || {};
    if (r.error) return "bad";
    if (s.finished) return "finished";
    // as /metrics' hybridrl_run_healthy: a write within max(120 s, 10 step times)
    return age(r) < Math.max(120, 10 * (s.median_step_s || 0)) ? "running" : "stalled";
  }
  function readHash() {
    const h = location.hash, q = h.indexOf("?");
    if (q < 0) return {};
    const out = {};
    for (const [k, v] of new URLSearchParams(h.slice(q + 1))) out[k] = k === "run" || k === "page" ? Number(v) : v;
    return out;
  }
  function writeHash(anchor) {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(insp)) if (v !== "" && v !== "all" && k !== "only" && k !== "diff" && !(k === "page" && v === 1) && !(k === "run" && (v === 0 || !inspChosen)) && !(k === "sort" && v === "step")) p.set(k, v);
    if (list.filter) p.set("filter", list.filter);
    if (list.status !== "all") p.set("status", list.status);
    if (list.compare !== null) p.set("compare", list.compare.join(","));
    const s = p.toString();
    history.replaceState(null, "", "#" + (anchor || "inspector") + (s ? "?" + s : ""));
  }

  // ---------------------------------------------------------------- charts
  function chartBox(parent, id, title) {
    const box = el("div", { class: "chart", id: "chart-" + id }, el("h3", {}, title));
    parent.append(box);
    return box;
  }
  function countInk(u, rgb) {
    // Pixels drawn in the first series' colour: proof in the DOM that the line was drawn.
    const c = u.ctx, w = c.canvas.width, h = c.canvas.height;
    const px = c.getImageData(0, 0, w, h).data;
    let n = 0;
    for (let i = 0; i < px.length; i += 4)
      if (px[i + 3] > 200 && Math.abs(px[i] - rgb[0]) < 40 && Math.abs(px[i + 1] - rgb[1]) < 40 && Math.abs(px[i + 2] - rgb[2]) < 40) n++;
    return n;
  }
  function hexRgb(h) { return [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16)); }

  // lines: [{label, run, key, xs, ys, stroke, dash, fill}]
  function plot(box, lines, opts) {
    opts = opts || {};
    if (!lines.length) { box.remove(); return null; }
    const tables = lines.map((l) => [l.xs, l.ys]);
    const data = tables.length === 1 ? tables[0] : uPlot.join(tables);
    const width = Math.max(300, box.clientWidth - 18);
    const series = [{ label: "step" }].concat(lines.map((l) => {
      const sparse = l.ys.filter((v) => v !== null).length;
      return {
        label: l.label, stroke: l.stroke, dash: l.dash, width: 1.6, fill: l.fill, spanGaps: true,
        points: { show: sparse <= 60, size: 5 }, value: l.value || ((u, v) => fmt(v)),
      };
    }));
    const u = new uPlot({
      width, height: opts.height || 220, series, legend: { live: true },
      scales: { x: { time: false } },
      axes: [{ label: "step", size: 34, labelSize: 14 }, { size: 56, values: (u, vals) => vals.map(axisFmt) }],
      cursor: { drag: { x: true, y: false } },
      hooks: { draw: [(u) => { box.dataset.ink = String(countInk(u, hexRgb(lines[0].stroke))); }] },
    }, data, box);
    plots.push(u);
    const cap = el("div", { class: "caption" });
    const last = {};
    for (const l of lines) {
      let i = l.ys.length - 1;
      while (i >= 0 && l.ys[i] === null) i--;
      if (i < 0) continue;
      const v = l.raw ? l.raw[i] : l.ys[i];
      last[l.label] = { step: l.xs[i], value: v };
      if (!opts.noCaption && lines.length <= 3) cap.append(el("span", { class: "last", "data-key": l.key, "data-run": l.run },
        l.label + ": last " + fmt(v) + " @ step " + l.xs[i]), "  ");
    }
    if (opts.caption) cap.append(opts.caption);
    box.append(cap);
    box.dataset.series = String(lines.length);
    box.dataset.points = String(data[0].length);
    box.dataset.last = JSON.stringify(last);
    return u;
  }

  function linesFor(keysOrMatch) {
    const lines = [];
    const vis = visibleRuns();
    for (const [run, ri] of vis) {
      const keys = typeof keysOrMatch === "function" ? Object.keys(run.series).filter((k) => k !== "step" && keysOrMatch(k)).sort() : keysOrMatch;
      let ki = 0;
      for (const key of keys) {
        const ys = run.series[key];
        if (!ys || !ys.some((v) => v !== null)) continue;
        const label = (vis.length > 1 ? run.name + " · " : "") + key;
        // One run: a colour per metric. Several runs: a colour per run, a dash per metric.
        const stroke = vis.length > 1 ? colorOf(run.name) : color(ki);
        lines.push({ label, run: run.name, key, xs: run.series.step, ys, stroke, dash: vis.length > 1 ? DASHES[ki % DASHES.length] : [] });
        ki++;
      }
    }
    // one metric per run: the legend names the runs only (the chart's title names the metric)
    if (vis.length > 1 && new Set(lines.map((l) => l.key)).size === 1) for (const l of lines) l.label = l.run;
    return lines;
  }

  function renderCurves() {
    const root = document.getElementById("charts");
    root.innerHTML = "";
    for (const c of CURVES) plot(chartBox(root, c.id, c.title), linesFor(c.match || c.keys));
    if (!root.children.length) root.append(el("p", {}, "No metrics yet."));
  }

  function renderTiming() {
    const root = document.getElementById("timing-charts");
    root.innerHTML = "";
    for (const [run, ri] of visibleRuns()) {
      const stages = Object.keys(run.series).filter((k) => k.startsWith("timing_s/") && k !== "timing_s/step");
      if (!stages.length) continue;
      const xs = run.series.step, mean = {};
      for (const k of stages) {
        const v = run.series[k].filter((x) => x !== null);
        mean[k] = v.reduce((a, b) => a + b, 0) / Math.max(1, v.length);
      }
      stages.sort((a, b) => mean[b] - mean[a]);
      // Stacked areas: series i is the sum of stages 0..i, drawn from the top down so each
      // band shows one stage; the legend shows the stage's own seconds.
      const rows = xs.map((_, j) => stages.map((k) => run.series[k][j] || 0));
      const cum = stages.map((_, i) => rows.map((r) => r.slice(0, i + 1).reduce((a, b) => a + b, 0)));
      const has = xs.map((_, j) => stages.some((k) => run.series[k][j] !== null));
      const lines = [];
      for (let i = stages.length - 1; i >= 0; i--) {
        const own = stages[i];
        const c = color(i);
        lines.push({
          label: own.replace("timing_s/", ""), run: run.name, key: own, xs, ys: cum[i].map((v, j) => (has[j] ? v : null)), raw: run.series[own],
          stroke: c, fill: c + "99", dash: [], value: (u, v, s, idx) => (idx === null || idx === undefined ? "–" : fmt(run.series[own][idx])),
        });
      }
      const total = stages.reduce((a, k) => a + mean[k], 0);
      const caption = el("div", {}, "mean per step: " + stages.map((k) => k.replace("timing_s/", "") + " " + fmt(mean[k]) + "s (" + Math.round((100 * mean[k]) / (total || 1)) + "%)").join(", "));
      plot(chartBox(root, "timing-" + ri, "Step time by stage (stacked) — " + run.name), lines, { noCaption: true, caption, height: 240 });
    }
    for (const c of PERF) plot(chartBox(root, c.id, c.title), linesFor(c.keys));
  }

  function renderAny() {
    const ctl = document.getElementById("any-controls"), root = document.getElementById("any-chart");
    const keys = [...new Set(visibleRuns().flatMap(([r]) => Object.keys(r.series)))].filter((k) => k !== "step").sort();
    const current = ctl.dataset.key && keys.includes(ctl.dataset.key) ? ctl.dataset.key : keys[0];
    ctl.innerHTML = "";
    if (!keys.length) return;
    const sel = el("select", { id: "any-key", onchange: (e) => { ctl.dataset.key = e.target.value; renderAny(); } }, keys.map((k) => el("option", { value: k }, k)));
    sel.value = current;
    ctl.dataset.key = current;
    ctl.append(el("div", { class: "controls" }, el("label", {}, "metric "), sel));
    root.innerHTML = "";
    plot(chartBox(root, "any", current), linesFor([current]));
  }

  // ---------------------------------------------------------------- summary
  function shownRuns() {
    const q = list.filter.toLowerCase();
    return DATA.runs.filter((r) => (!q || r.name.toLowerCase().includes(q)) && (list.status === "all" || statusOf(r) === list.status));
  }
  function setCompare(names, anchor) {
    list.compare = names.slice(0, MAX_COMPARE);
    writeHash(anchor || "runs");
    if (LIVE) {  // curves of runs no longer compared go (they would go stale); new ones load now
      for (const r of DATA.runs) if (!list.compare.includes(r.name)) r.series = null;
      schedule(0);
    }
    renderRuns();
    renderSummary();
    renderAllCharts();
    renderInspector();
  }
  function initRunControls() {
    const root = document.getElementById("runs");
    if (root.dataset.ready) return;
    root.dataset.ready = "1";
    const q = el("input", { id: "run-filter", type: "search", placeholder: "name contains", value: list.filter,
      oninput: (e) => { list.filter = e.target.value; writeHash("runs"); renderRuns(); } });
    const st = el("select", { id: "run-status", onchange: (e) => { list.status = e.target.value; writeHash("runs"); renderRuns(); } },
      ["all", "running", "stalled", "finished", "bad"].map((v) => el("option", { value: v }, v)));
    st.value = list.status;
    root.append(el("div", { class: "controls" },
      el("span", {}, el("label", {}, "runs "), q), el("span", {}, el("label", {}, "status "), st),
      el("button", { id: "compare-shown", onclick: () => setCompare(shownRuns().map((r) => r.name)) }, "compare shown"),
      el("button", { id: "compare-none", onclick: () => setCompare([]) }, "clear"),
      el("span", { id: "run-count", class: "muted" })),
      el("div", { class: "runlist", id: "run-list" }));
  }
  function renderRuns() {
    initRunControls();
    const box = document.getElementById("run-list");
    const sel = compared(), shown = shownRuns();
    const counts = {};
    for (const r of DATA.runs) counts[statusOf(r)] = (counts[statusOf(r)] || 0) + 1;
    document.getElementById("run-count").textContent = shown.length + " of " + DATA.runs.length + " runs shown · " + sel.length +
      " compared (up to " + MAX_COMPARE + ") · " + Object.entries(counts).map(([k, n]) => n + " " + k).join(", ");
    const head = el("tr", {}, ["", "run", "status", "step", "reward (last)", "step time", "last written"].map((h) => el("th", {}, h)));
    const rows = shown.map((r) => {
      const on = sel.includes(r.name), s = r.summary || {}, status = statusOf(r);
      const cb = el("input", { type: "checkbox", onchange: (e) => {
        const cur = compared().filter((n) => n !== r.name);
        setCompare(e.target.checked ? cur.concat([r.name]) : cur);
      } });
      cb.checked = on;
      if (!on && sel.length >= MAX_COMPARE) cb.disabled = true;
      return el("tr", { class: "run-row" + (on ? " on" : ""), "data-run": r.name, "data-status": status, "data-selected": on ? "1" : "0" },
        el("td", {}, cb, on ? el("span", { class: "swatch", style: "background:" + colorOf(r.name) }) : null),
        el("td", { class: "rname" }, r.name),
        el("td", { class: "status-" + status, title: r.error || "" }, status, r.error ? el("span", { class: "reason" }, ": " + r.error) : null),
        el("td", { class: "num" }, s.last_step !== undefined ? s.last_step + (s.total_steps ? " / " + s.total_steps : "") : "–"),
        el("td", { class: "num" }, fmt(s.reward_last)),
        el("td", { class: "num" }, s.median_step_s ? fmt(s.median_step_s) + " s" : "–"),
        el("td", { class: "num" }, s.finished ? "finished" : age(r) === Infinity ? "–" : dur(age(r)) + " ago"));
    });
    box.replaceChildren(el("table", { id: "run-table" }, head, rows));
    document.body.dataset.runs = String(DATA.runs.length);
    document.body.dataset.lastSteps = JSON.stringify(Object.fromEntries(DATA.runs.map((r) => [r.name, r.summary.last_step])));
    const notes = document.getElementById("notes");
    notes.innerHTML = "";
    for (const [r] of visibleRuns()) for (const n of r.notes || []) notes.append(el("div", { class: "notes" }, "⚠ " + n));
    for (const [r] of visibleRuns()) if (r.samples_dropped) notes.append(el("div", { class: "notes" }, r.name + ": " + r.samples_dropped + " prompt groups left out (all the groups of evenly spaced steps are kept; hybridrl report --max-samples N for more)"));
  }

  function renderSummary() {
    const root = document.getElementById("summary-body");
    root.innerHTML = "";
    const runs = visibleRuns().map(([r]) => r);
    if (!runs.length) return;
    const S = runs.map((r) => r.summary);
    // the typical step: the median of the steps after the first, which compiles and warms up
    const stepTime = (s) => {
      if (!s.median_step_s) return s.mean_step_s ? " (" + fmt(s.mean_step_s) + " s/step)" : "";
      const [a, b] = s.median_steps;
      if (a === s.first_step) return " (" + fmt(s.median_step_s) + " s/step)";
      return " (" + fmt(s.median_step_s) + " s/step, median of steps " + a + "–" + b + "; step " + s.first_step + ": " + fmt(s.first_step_s) + " s)";
    };
    const row = (label, f, cls) => el("tr", {}, el("th", {}, label), S.map((s, i) => el("td", { class: cls || "", "data-field": label }, f(s, runs[i]))));
    const valKeys = [...new Set(S.flatMap((s) => Object.keys(s.validation || {})))].sort();
    const t = el("table", { id: "summary-table" },
      el("tr", {}, el("th", {}, ""), runs.map((r) => el("th", {}, r.name))),
      row("run directory", (s) => s.path),
      row("model", (s) => s.model || "–"),
      row("algorithm", (s) => s.algorithm || "–"),
      row("steps", (s) => s.last_step + (s.total_steps ? " / " + s.total_steps : ""), "num"),
      row("devices", (s) => (s.devices ? s.devices + " × " : "") + (s.device || "–")),
      row("training time", (s) => dur(s.train_time_s) + stepTime(s), "num"),
      row("reward, first → last", (s) => s.reward_key ? fmt(s.reward_first) + " → " + fmt(s.reward_last) + " (" + s.reward_key + ", mean of " + s.reward_window + " step(s) at each end)" : "–"),
      valKeys.map((k) => row(k, (s) => {
        const v = (s.validation || {})[k];
        return v ? "before " + fmt(v.first) + " (step " + v.first_step + ") · last " + fmt(v.last) + " (step " + v.last_step + ") · best " + fmt(v.best) + " (step " + v.best_step + ")" : "–";
      })),
      row("samples", (s) => s.samples + " prompt groups", "num"),
      row("status", (s) => s.finished ? "finished" : s.updated_age_s !== null && s.updated_age_s !== undefined ? "last written " + dur(s.updated_age_s) + " ago" : "–"),
      row("config (differs from the defaults)", (s, r) => r.config_diff && r.config_diff.length
        ? el("pre", { class: "cfg" }, r.config_diff.map((d) => d[0] + " = " + JSON.stringify(d[1]) + "   (default " + JSON.stringify(d[2]) + ")").join("\n"))
        : "–"),
    );
    root.append(t);
  }

  // ---------------------------------------------------------------- rollout inspector
  function groupsOf(run) { return run ? run.samples || [] : []; }
  function mean(xs) { const v = xs.filter((x) => x !== null && x !== undefined); return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null; }
  function inRange(s) {
    if (s === null || s === undefined) return insp.min === "" && insp.max === "";
    return (insp.min === "" || s >= Number(insp.min)) && (insp.max === "" || s <= Number(insp.max));
  }
  function filtered(run) {
    const q = insp.q.toLowerCase();
    let gs = groupsOf(run).filter((g) =>
      (insp.kind === "all" || g.kind === insp.kind) &&
      (insp.step === "all" || String(g.step) === String(insp.step)) &&
      (insp.src === "" || g.data_source === insp.src) &&
      g.scores.some(inRange) &&
      (!q || g.prompt.toLowerCase().includes(q) || g.responses.some((r) => r.toLowerCase().includes(q))));
    if (insp.sort === "score") gs = gs.slice().sort((a, b) => mean(b.scores) - mean(a.scores));
    else if (insp.sort === "spread") gs = gs.slice().sort((a, b) => (Math.max(...b.scores) - Math.min(...b.scores)) - (Math.max(...a.scores) - Math.min(...a.scores)));
    else gs = gs.slice().sort((a, b) => b.step - a.step || (a.kind < b.kind ? -1 : 1));
    return gs;
  }
  function control(label, node) { return el("span", {}, el("label", {}, label + " "), node); }
  function set(k, v) { if (k === "run") inspChosen = true; insp[k] = v; if (k !== "page") insp.page = 1; writeHash(); renderInspector(); }

  function renderInspector() {
    const ctl = document.getElementById("inspector-controls"), body = document.getElementById("inspector-body");
    ctl.innerHTML = ""; body.innerHTML = "";
    if (!inspChosen) insp.run = Math.max(0, DATA.runs.findIndex((r) => r.name === compared()[0]));
    if (insp.run >= DATA.runs.length) insp.run = 0;
    const run = DATA.runs[insp.run];
    if (run && LIVE) loadSamples(run);
    const all = groupsOf(run);
    if (!run || !all.length) { body.append(el("p", {}, "No samples in this run (samples.jsonl; trainer.log_samples prompts per step).")); return; }
    const steps = [...new Set(all.map((g) => g.step))].sort((a, b) => a - b);
    const sources = [...new Set(all.map((g) => g.data_source).filter((s) => s))].sort();
    const mk = (id, opts, val, key) => { const s = el("select", { id, onchange: (e) => set(key, key === "run" ? Number(e.target.value) : e.target.value) }, opts.map(([v, t]) => el("option", { value: v }, t))); s.value = String(val); return s; };
    const inp = (id, type, val, key, ph) => el("input", { id, type, value: val, placeholder: ph || "", step: "any", onchange: (e) => set(key, e.target.value) });
    ctl.append(el("div", { class: "controls" },
      DATA.runs.length > 1 ? control("run", mk("f-run", DATA.runs.map((r, i) => [i, r.name]), insp.run, "run")) : null,
      control("kind", mk("f-kind", [["all", "training + validation"], ["train", "training"], ["val", "validation"]], insp.kind, "kind")),
      control("step", mk("f-step", [["all", "all steps"]].concat(steps.map((s) => [s, s])), insp.step, "step")),
      control("data source", mk("f-src", [["", "all"]].concat(sources.map((s) => [s, s])), insp.src, "src")),
      control("score ≥", inp("f-min", "number", insp.min, "min")),
      control("score ≤", inp("f-max", "number", insp.max, "max")),
      control("text", inp("f-q", "search", insp.q, "q", "prompt or response")),
      control("sort", mk("f-sort", [["step", "newest step"], ["score", "mean score"], ["spread", "score spread"]], insp.sort, "sort")),
    ));
    const gs = filtered(run);
    const pages = Math.max(1, Math.ceil(gs.length / PAGE));
    insp.page = Math.min(Math.max(1, insp.page), pages);
    const pager = () => el("div", { class: "pager" },
      el("button", { onclick: () => set("page", insp.page - 1), disabled: insp.page <= 1 ? "" : null }, "‹ prev"),
      el("span", { class: "page-info" }, "page " + insp.page + " of " + pages + " · ", el("b", { id: "match-count" }, String(gs.length)), " of " + all.length + " prompt groups"),
      el("button", { onclick: () => set("page", insp.page + 1), disabled: insp.page >= pages ? "" : null }, "next ›"));
    body.append(pager());
    const shown = gs.slice((insp.page - 1) * PAGE, insp.page * PAGE);
    if (insp.diff === "1" && !Object.keys(diffOpen).length) {  // #inspector?diff=1: open the first diff view
      const g = shown.find((g) => groupsOf(run).filter((h) => h.prompt === g.prompt && h.kind === g.kind).length > 1);
      if (g) diffOpen[g.kind + ":" + g.step + ":" + g.uid] = true;
    }
    for (const g of shown) body.append(renderGroup(run, g));
    if (gs.length > PAGE) body.append(pager());
  }

  function scoreCls(s) { return s === null || s === undefined ? "" : s > 0 ? "score-hi" : "score-lo"; }
  function renderGroup(run, g) {
    const id = g.kind + ":" + g.step + ":" + g.uid;
    const same = groupsOf(run).filter((h) => h.prompt === g.prompt && h.kind === g.kind);
    const head = el("div", { class: "ghead" },
      el("span", {}, "step ", el("b", {}, String(g.step))), el("span", {}, g.kind === "val" ? "validation" : "training"),
      g.data_source ? el("span", {}, "source ", el("b", {}, g.data_source)) : null,
      g.ground_truth !== null && g.ground_truth !== undefined ? el("span", {}, "ground truth ", el("b", {}, typeof g.ground_truth === "string" ? g.ground_truth : JSON.stringify(g.ground_truth))) : null,
      el("span", {}, "mean score ", el("b", {}, fmt(mean(g.scores)))), el("span", {}, g.responses.length + " response(s)"),
      same.length > 1 ? el("button", { onclick: () => { diffOpen[id] = !diffOpen[id]; renderInspector(); } }, diffOpen[id] ? "hide steps" : "same prompt at " + same.length + " steps") : null);
    const tbl = el("table", {}, el("tr", {}, el("th", {}, "#"), el("th", {}, "score"), el("th", {}, "advantage"), el("th", {}, "length"), el("th", {}, "response")),
      g.responses.map((r, j) => el("tr", { class: "resp-row" + (inRange(g.scores[j]) ? "" : " dim"), style: inRange(g.scores[j]) ? null : "opacity:.45" },
        el("td", { class: "num" }, String(j + 1)), el("td", { class: "num score " + scoreCls(g.scores[j]) }, fmt(g.scores[j])),
        el("td", { class: "num" }, fmt(g.advantages[j])), el("td", { class: "num" }, fmt(g.response_lengths ? g.response_lengths[j] : null)),
        el("td", { class: "resp" }, el("pre", {}, r)))));
    const box = el("div", { class: "group", "data-step": g.step, "data-kind": g.kind, "data-source": g.data_source, "data-scores": JSON.stringify(g.scores) },
      head, el("div", { class: "prompt" }, el("pre", {}, g.prompt)), tbl);
    if (diffOpen[id] && same.length > 1) box.append(renderDiff(same, g));
    return box;
  }

  function best(g) { let j = 0; g.scores.forEach((s, i) => { if ((s ?? -Infinity) > (g.scores[j] ?? -Infinity)) j = i; }); return j; }
  function renderDiff(same, g) {
    same = same.slice().sort((a, b) => a.step - b.step);
    const key = "diff:" + g.kind + ":" + g.uid;
    const st = diffOpen[key] || { a: same[0].step, b: same[same.length - 1].step };
    diffOpen[key] = st;
    const pick = (which) => { const s = el("select", { onchange: (e) => { st[which] = Number(e.target.value); renderInspector(); } }, same.map((h) => el("option", { value: h.step }, "step " + h.step + " (mean " + fmt(mean(h.scores)) + ")"))); s.value = String(st[which]); return s; };
    const A = same.find((h) => h.step === st.a) || same[0], B = same.find((h) => h.step === st.b) || same[same.length - 1];
    const ja = best(A), jb = best(B);
    const trend = el("div", {}, "mean score by step: " + same.map((h) => h.step + ": " + fmt(mean(h.scores))).join(" · "));
    return el("div", { class: "diff" }, trend,
      el("div", { class: "controls" }, control("compare", pick("a")), control("with", pick("b")), el("span", {}, "(best-scoring response of each; deletions red, insertions green)")),
      el("div", { class: "cols" },
        el("div", {}, el("b", {}, "step " + A.step + " · score " + fmt(A.scores[ja])), el("pre", { html: wordDiff(A.responses[ja], B.responses[jb], "del") })),
        el("div", {}, el("b", {}, "step " + B.step + " · score " + fmt(B.scores[jb])), el("pre", { html: wordDiff(A.responses[ja], B.responses[jb], "ins") }))));
  }
  function esc(s) { return s.replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" })[c]); }
  function tokens(s) { const t = s.match(/\s+|\w+|[^\w\s]/g) || []; return t.length > 3000 ? [s] : t; }
  // LCS diff on words; side "del" marks what A lost, "ins" what B gained.
  function wordDiff(a, b, side) {
    const x = tokens(a), y = tokens(b), n = x.length, m = y.length;
    const L = Array.from({ length: n + 1 }, () => new Uint16Array(m + 1));
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    let i = 0, j = 0, out = "";
    while (i < n || j < m) {
      if (i < n && j < m && x[i] === y[j]) { out += esc(x[i]); i++; j++; }
      else if (j >= m || (i < n && L[i + 1][j] >= L[i][j + 1])) { if (side === "del") out += "<del>" + esc(x[i]) + "</del>"; i++; }
      else { if (side === "ins") out += "<ins>" + esc(y[j]) + "</ins>"; j++; }
    }
    return out;
  }

  // ---------------------------------------------------------------- page
  function renderAllCharts() {
    for (const u of plots) u.destroy();
    plots = [];
    renderCurves();
    renderTiming();
    renderAny();
  }
  function renderAll() {
    // #...?only=curves|timing|inspector|summary shows one section (links and screenshots).
    const only = readHash().only;
    if (only) for (const sec of document.querySelectorAll("main > section")) sec.style.display = sec.id === only || (only === "summary" && sec.id === "runs-section") ? "" : "none";
    // Over MAX_COMPARE runs the default choice (the most recently written) is kept from the first
    // view on, so the charts do not jump between runs as they write.
    if (list.compare === null && DATA.runs.length > MAX_COMPARE) list.compare = compared();
    renderRuns();
    renderSummary();
    renderAllCharts();
    renderInspector();
    document.getElementById("generated").textContent = (LIVE ? "live from the dashboard" : "generated") + " " + (DATA.generated || "");
    setTimeout(measure, 50);  // after uPlot's first draw (it sizes its plots in a microtask)
  }
  function measure() {  // the page's height, in the DOM for the browser test and docs/observability.md
    const foot = document.querySelector("footer");
    document.body.dataset.height = String(Math.round(foot.getBoundingClientRect().bottom + window.scrollY));
    document.body.dataset.sections = JSON.stringify(Object.fromEntries([...document.querySelectorAll("main > section")].map((x) => [x.id, Math.round(x.getBoundingClientRect().height)])));
  }

  // ---------------------------------------------------------------- live updates
  function appendSeries(series, add) {
    const n = series.step.length, m = add.step.length;
    for (const k of Object.keys(add)) if (!series[k]) series[k] = new Array(n).fill(null);
    for (const k of Object.keys(series)) {
      const col = add[k] || new Array(m).fill(null);
      for (let i = 0; i < m; i++) series[k].push(col[i]);
    }
  }
  // Merges an answer of /api/data into DATA; true when a compared run (or the list of runs) changed.
  // A run comes whole (`series`: its curves), as new metric lines (`append`), or as its summary.
  function merge(d) {
    const byName = new Map(DATA.runs.map((r) => [r.name, r]));
    const sel = compared();
    let touched = !!d.names && (d.names.length !== DATA.runs.length || d.names.some((n, i) => DATA.runs[i].name !== n));
    for (const p of d.runs) {
      const old = byName.get(p.name);
      if (sel.includes(p.name)) touched = true;
      p._received = Date.now();
      if (p.series || !old) {
        if (old && old.samples) { p.samples = old.samples; p._samples = old._samples; }
        if (!p.series) p.series = null;
        byName.set(p.name, p);
        continue;
      }
      if (p.append && old.series && old.epoch === p.epoch) appendSeries(old.series, p.append);
      else old.series = null;  // not compared, or out of step: loaded whole when compared
      for (const k of ["epoch", "summary", "points", "notes", "error", "_received"]) if (k in p) old[k] = p[k];
    }
    DATA.runs = d.names ? d.names.map((n) => byName.get(n)).filter((r) => r) : DATA.runs.map((r) => byName.get(r.name));
    DATA.generated = d.generated;
    return touched;
  }

  let timer = null, inflight = false, again = false;
  function schedule(ms) { clearTimeout(timer); timer = setTimeout(poll, ms); }
  function pollUrl() {
    const p = new URLSearchParams();
    if (cursor) p.set("since", cursor);
    const sel = polls === 0 && list.compare === null ? [] : compared();  // first answer: summaries, then the default's curves
    const byName = new Map(DATA.runs.map((r) => [r.name, r]));
    const have = sel.filter((n) => byName.has(n) && byName.get(n).series);
    const load = sel.filter((n) => byName.has(n) && !byName.get(n).series);
    if (!have.length) p.append("series", "");
    for (const n of have) p.append("series", n);
    for (const n of load) p.append("load", n);
    return [LIVE.url + "?" + p.toString(), load.length];
  }
  async function poll() {
    if (inflight) { again = true; return; }
    inflight = true;
    let soon = false;
    try {
      const [url] = pollUrl();
      const res = await fetch(url, { cache: "no-store" });
      const text = await res.text();
      const d = JSON.parse(text);
      sent.push(text.length);
      const first = polls === 0;
      cursor = d.cursor;
      polls++;
      if (merge(d) || first) renderAll();
      else if (d.runs.length) renderRuns();
      soon = pollUrl()[1] > 0;  // compared runs whose curves are still to load
      const st = document.getElementById("status");
      st.textContent = "live · " + DATA.runs.length + " run(s) · refreshed " + new Date().toLocaleTimeString() + " · every " + LIVE.interval_ms / 1000 + " s";
      st.dataset.polls = String(polls);
      st.dataset.bytes = JSON.stringify(sent);
    } catch (e) {
      document.getElementById("status").textContent = "live · dashboard unreachable (" + e + "), retrying";
    }
    inflight = false;
    schedule(soon || again ? 0 : LIVE.interval_ms);
    again = false;
  }
  async function loadSamples(run) {  // the dashboard serves prompt groups one run at a time
    const want = (run.summary || {}).samples || 0;
    if (!LIVE || loadingSamples[run.name] || run._samples === want) return;
    loadingSamples[run.name] = true;
    try {
      const res = await fetch(LIVE.samples_url + "?run=" + encodeURIComponent(run.name), { cache: "no-store" });
      const d = await res.json();
      run.samples = d.samples || [];
      run.samples_dropped = d.samples_dropped || 0;
      run._samples = want;
    } finally {
      loadingSamples[run.name] = false;
    }
    renderInspector();
  }

  let resizeTimer = null;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(renderAllCharts, 200); });
  if (LIVE) schedule(0);
  else renderAll();
})();
