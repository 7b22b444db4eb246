// scrapy-retryqueue dashboard: refreshes the overview from /api and runs actions.
// Text from tasks (URLs, errors, domains) is only ever set with textContent.
"use strict";

(function () {
  const body = document.body;

  function cookie(name) {
    for (const part of document.cookie.split(";")) {
      const [k, ...v] = part.trim().split("=");
      if (k === name) return decodeURIComponent(v.join("="));
    }
    return "";
  }

  function toast(text) {
    const el = document.getElementById("toast");
    if (!el) return;
    el.textContent = text;
    el.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { el.hidden = true; }, 6000);
  }

  function fmt(n) {
    return n === null || n === undefined ? "–" : Number(n).toLocaleString();
  }

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function fillTable(id, rows, cells) {
    const tbody = document.querySelector("#" + id + " tbody");
    if (!tbody) return;
    tbody.replaceChildren();
    if (!rows.length) {
      const tr = el("tr");
      const td = el("td", "nothing yet", "muted");
      td.colSpan = 8;
      tr.append(td);
      tbody.append(tr);
      return;
    }
    for (const row of rows) {
      const tr = el("tr");
      cells(row).forEach((value, i) => tr.append(el("td", value, i ? "num" : "")));
      tbody.append(tr);
    }
  }

  // -- the overview --------------------------------------------------------------

  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = { scheduled: "#d97706", recovered: "#16a34a", dead: "#dc2626" };

  // 3164.9 -> "52 min 45 s" (as the pages' duration filter).
  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    let left = Math.round(Number(seconds));
    if (left < 60) return left + " s";
    const parts = [];
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]]) {
      if (left >= size) { parts.push(Math.floor(left / size) + " " + unit); left %= size; }
    }
    return parts.slice(0, 2).join(" ");
  }

  function percent(rate) {
    return rate === null || rate === undefined ? "–" : (100 * rate).toFixed(1) + " %";
  }

  function drawChart(chart) {
    const box = document.getElementById("chart");
    if (!box) return;
    const title = document.getElementById("chart-title");
    const step = chart.step_seconds;
    const per = step === 1 ? "second" : step === 60 ? "minute" : duration(step);
    title.textContent = "Scheduled, recovered and dead per " + per + " (" +
      (chart.span_seconds < (chart.window === "day" ? 86400 : 3600)
        ? "the last " + duration(chart.span_seconds) + " of activity"
        : "last " + chart.window) + ")";
    const series = chart.series;
    const n = series.scheduled.length;
    const max = Math.max(1, ...series.scheduled, ...series.recovered, ...series.dead);
    // One SVG unit per CSS pixel: labels keep their shape in a narrow window.
    const W = Math.max(200, box.clientWidth || 1000), H = Math.max(120, box.clientHeight || 200);
    const L = 40, B = 20, R = 8;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("role", "img");
    const line = (x1, y1, x2, y2, color) => {
      const l = document.createElementNS(SVG, "line");
      l.setAttribute("x1", x1); l.setAttribute("y1", y1);
      l.setAttribute("x2", x2); l.setAttribute("y2", y2);
      l.setAttribute("stroke", color); l.setAttribute("stroke-width", "1");
      svg.append(l);
    };
    const label = (x, y, text, anchor, cls) => {
      const t = document.createElementNS(SVG, "text");
      t.setAttribute("x", x); t.setAttribute("y", y);
      t.setAttribute("font-size", "11"); t.setAttribute("fill", "#667085");
      t.setAttribute("text-anchor", anchor || "start");
      if (cls) t.setAttribute("class", cls);
      t.textContent = text;
      svg.append(t);
    };
    // Bucket i spans [x(i), x(i + 1)]: each count is drawn as a flat step of its bucket's
    // width, so a burst within one bucket reads as a bar, not a hairline spike.
    const x = (i) => L + (i * (W - L - R)) / Math.max(1, n);
    const y = (v) => H - B - (v / max) * (H - B - 4);
    // Y axis: 0, the middle and the top, with faint grid lines.
    for (const v of max >= 2 ? [0, max / 2, max] : [0, max]) {
      line(L, y(v), x(n), y(v), v ? "#eef0f3" : "#d9dde3");
      label(L - 4, y(v) + 4, Number.isInteger(v) ? fmt(v) : v.toFixed(1), "end");
    }
    // X axis: at least three time labels (start, middle, end), more as the width allows,
    // each with room for its text (a time with seconds is wider).
    const opts = step < 60
      ? { hour: "2-digit", minute: "2-digit", second: "2-digit" }
      : { hour: "2-digit", minute: "2-digit" };
    const room = step < 60 ? 130 : 100;
    const ticks = Math.max(3, Math.min(n + 1, Math.floor((W - L - R) / room) + 1));
    const marks = [...new Set(Array.from({ length: ticks }, (_, k) => Math.round((k * n) / (ticks - 1))))];
    for (const i of marks) {
      const at = new Date(chart.start + i * step * 1000);
      line(x(i), H - B, x(i), H - B + 4, "#d9dde3");
      const anchor = i === 0 ? "start" : i === n ? "end" : "middle";
      label(x(i), H - 4, at.toLocaleTimeString([], opts), anchor, "tick");
    }
    for (const name of ["scheduled", "recovered", "dead"]) {
      const p = document.createElementNS(SVG, "polyline");
      const points = series[name].flatMap((v, i) => [x(i), y(v), x(i + 1), y(v)]);
      const pairs = [];
      for (let k = 0; k < points.length; k += 2) pairs.push(points[k].toFixed(1) + "," + points[k + 1].toFixed(1));
      p.setAttribute("points", pairs.join(" "));
      p.setAttribute("fill", "none");
      p.setAttribute("stroke", COLORS[name]);
      p.setAttribute("stroke-width", "2");
      p.setAttribute("stroke-linejoin", "round");
      p.setAttribute("vector-effect", "non-scaling-stroke");
      p.setAttribute("data-series", name);
      svg.append(p);
    }
    box.replaceChildren(svg);
  }

  function renderOverview(data) {
    const t = data.totals;
    for (const name of ["pending", "due_now", "leased", "failures_today", "dead"]) {
      document.getElementById("t-" + name).textContent = fmt(t[name]);
    }
    document.getElementById("t-success_rate").textContent = percent(t.success_rate);
    document.getElementById("t-rate-detail").textContent =
      fmt(t.recovered) + " recovered / " + fmt(t.recovered + t.given_up) + " retried";
    const notes = document.getElementById("notes");
    notes.replaceChildren(...data.notes.map((n) => el("li", n)));
    drawChart(data.chart);
    fillTable("by-kind", Object.entries(data.by_kind), ([k, v]) => [k, fmt(v.pending), fmt(v.recovered),
      fmt(v.dead), percent(v.recovery_rate), duration(v.recover_median_s), duration(v.recover_p90_s)]);
    fillTable("by-domain", data.top_domains, (d) => [d.domain, fmt(d.pending), fmt(d.dead)]);
    fillTable("by-node", data.nodes, (d) => [d.node, fmt(d.leased)]);
    fillTable("by-cooling", data.cooling || [], (c) =>
      [c.domain, c.spider, c.state, new Date(c.until).toLocaleTimeString(), c.reason || ""]);
    fillTable("by-spider", Object.entries(data.spiders), ([s, e]) =>
      [s, fmt(e.due), fmt(e.due_now), fmt(e.leased), fmt(e.succeeded), fmt(e.dead), fmt(e.events_unwritten)]);
    document.getElementById("updated").textContent =
      "updated " + new Date(data.generated_at).toLocaleTimeString();
  }

  async function refreshOverview() {
    const root = document.getElementById("overview");
    try {
      const query = new URLSearchParams({ window: root.dataset.window });
      if (root.dataset.spider) query.set("spider", root.dataset.spider);
      const reply = await fetch("/api/overview?" + query, { headers: { Accept: "application/json" } });
      const data = await reply.json();
      if (!reply.ok) throw new Error(data.detail || reply.statusText);
      renderOverview(data);
      root.dataset.loaded = String(Number(root.dataset.loaded || 0) + 1);
    } catch (err) {
      document.getElementById("updated").textContent = "refresh failed: " + err.message;
    }
  }

  if (document.getElementById("overview")) {
    refreshOverview();
    const every = Math.max(0.5, Number(body.dataset.refresh) || 5) * 1000;
    setInterval(() => { if (!document.hidden) refreshOverview(); }, every);
  }

  // -- times in the reader's zone ----------------------------------------------------

  for (const node of document.querySelectorAll("[data-time]")) {
    const value = node.dataset.time;
    if (value && node.textContent.trim()) {
      const d = new Date(value);
      if (!isNaN(d)) { node.title = value; node.textContent = d.toLocaleString(); }
    }
  }

  // -- actions -----------------------------------------------------------------------

  const LABELS = { retry_now: "Retry now", cancel: "Cancel", requeue: "Requeue", purge: "Purge (delete)" };

  async function post(action, payload) {
    const reply = await fetch("/api/actions/" + action, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": cookie("rq_csrf") },
      body: JSON.stringify(payload),
      credentials: "same-origin",
    });
    const data = await reply.json();
    if (!reply.ok) throw new Error(data.detail || reply.statusText);
    return data;
  }

  async function act(action, payload) {
    try {
      const preview = await post(action, { ...payload, dry_run: true });
      if (!preview.matched) {
        toast(LABELS[action] + ": no task here is in a state it applies to");
        return;
      }
      const question = LABELS[action] + ": this will touch " + preview.matched + " task(s) (" +
        preview.filter + "). Go ahead?";
      if (!window.confirm(question)) return;
      const done = await post(action, { ...payload, dry_run: false });
      toast(LABELS[action] + ": " + done.changed + " changed" +
        (done.skipped ? ", " + done.skipped + " skipped (no longer in that state)" : ""));
      setTimeout(() => window.location.reload(), 700);
    } catch (err) {
      toast(LABELS[action] + " failed: " + err.message);
    }
  }

  const single = document.getElementById("task-actions");
  if (single) {
    for (const button of single.querySelectorAll("button[data-action]")) {
      button.addEventListener("click", () => act(button.dataset.action, { ids: [single.dataset.ids] }));
    }
  }

  const bulk = document.getElementById("bulk-actions");
  if (bulk) {
    const picks = () => [...document.querySelectorAll("input.pick:checked")].map((b) => b.value);
    const counter = document.getElementById("selected-count");
    const update = () => { counter.textContent = String(picks().length); };
    document.querySelectorAll("input.pick").forEach((b) => b.addEventListener("change", update));
    const all = document.getElementById("select-all");
    if (all) all.addEventListener("change", () => {
      document.querySelectorAll("input.pick").forEach((b) => { b.checked = all.checked; });
      update();
    });
    const filters = JSON.parse(document.getElementById("filter-json").textContent || "{}");
    for (const button of bulk.querySelectorAll("button[data-action]")) {
      button.addEventListener("click", () => {
        const ids = picks();
        act(button.dataset.action, ids.length ? { ids } : { filters: { status: "all", ...filters } });
      });
    }
  }
})();
