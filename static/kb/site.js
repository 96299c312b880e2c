/* kernelbot progressive enhancement: countdowns, live rankings, live submission status, SVG charts.
   Pages work without it; no dependencies. */
"use strict";
(function () {
  const $ = (s, r) => (r || document).querySelector(s);
  const $$ = (s, r) => Array.from((r || document).querySelectorAll(s));
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

  function formatNs(ns) {
    if (ns === null || ns === undefined || !isFinite(ns)) return "–";
    for (const [unit, scale] of [["s", 1e9], ["ms", 1e6], ["µs", 1e3]]) {
      if (Math.abs(ns) >= scale) { const v = ns / scale; return v.toFixed(v < 10 ? 3 : v < 100 ? 2 : 1) + " " + unit; }
    }
    return Math.abs(ns) >= 10 ? ns.toFixed(0) + " ns" : ns.toFixed(2) + " ns";
  }
  window.kbFormatNs = formatNs;

  // Deadlines in the visitor's local time, with a countdown.
  function tick() {
    for (const el of $$("time[data-countdown]")) {
      const t = new Date(el.getAttribute("datetime")), left = t - Date.now();
      const local = t.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
      if (left <= 0) { el.textContent = local + " (closed)"; continue; }
      const d = Math.floor(left / 864e5), h = Math.floor(left / 36e5) % 24, m = Math.floor(left / 6e4) % 60, s = Math.floor(left / 1e3) % 60;
      el.textContent = local + " (" + (d ? d + "d " : "") + h + "h " + m + "m " + s + "s left)";
    }
  }
  tick(); setInterval(tick, 1000);

  // A websocket that reconnects with backoff; onopen lets the consumer send its snapshot.
  function socket(path, onMessage, status) {
    let delay = 500, ws;
    const open = () => {
      ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
      ws.onopen = () => { delay = 500; if (status) status.classList.add("on"), (status.textContent = "live"); };
      ws.onmessage = (e) => onMessage(JSON.parse(e.data), ws);
      ws.onclose = (e) => {
        if (status) status.classList.remove("on"), (status.textContent = "reconnecting…");
        if (e.code >= 4000) return; // refused: not allowed or unknown
        setTimeout(open, delay); delay = Math.min(delay * 2, 15000);
      };
    };
    open();
    return () => ws;
  }

  // Live leaderboard: snapshot on connect, versioned deltas after; a gap asks for a fresh snapshot.
  const live = $("#live-status[data-ws^='/ws/leaderboard/']");
  if (live && !live.hasAttribute("data-off")) {
    let version = -1; let rows = new Map();
    const tbody = $("#ranking tbody");
    const render = (fresh) => {
      const sorted = Array.from(rows.values()).sort((a, b) => a.rank - b.rank || a.score - b.score).slice(0, 50);
      if (!sorted.length) return;
      const old = new Map($$("tr[data-user]", tbody).map((tr) => [tr.dataset.user, tr]));
      tbody.innerHTML = "";
      for (const e of sorted) {
        const prev = old.get(String(e.user));
        const same = prev && prev.dataset.sub === String(e.submission) && prev.dataset.rank === String(e.rank);
        const tr = same ? prev : document.createElement("tr");
        if (!same) {
          const ratio = e.ratio ? `${Number(e.ratio).toFixed(3)}×` : "–";
          const kept = prev ? Array.from(prev.children).slice(3).map((td) => td.outerHTML).join("") : `<td class='muted'>${ratio}</td><td class='muted'>just now</td><td></td>`;
          tr.innerHTML = `<td class="num">${e.rank}</td><td><a href="/u/${encodeURIComponent(e.name)}/">${esc(e.name)}</a></td>` +
            `<td class="num" data-score="${e.score}"><a href="/s/${e.submission}/">${formatNs(e.score * 1e9)}</a></td>` + (prev && prev.dataset.sub === String(e.submission) ? kept : `<td class='muted'>${ratio}</td><td class='muted'>just now</td><td></td>`);
          tr.dataset.user = e.user; tr.dataset.sub = e.submission; tr.dataset.rank = e.rank;
          if (fresh) tr.classList.add("fresh");
        }
        tr.classList.toggle("tied", !!e.tied);
        if (e.tied) tr.title = "statistically tied with the entry above"; else tr.removeAttribute("title");
        tbody.appendChild(tr);
      }
    };
    for (const tr of $$("tr[data-user]", tbody)) {
      tr.dataset.rank = tr.children[0].textContent.trim();
      tr.dataset.sub = (tr.children[2].querySelector("a").getAttribute("href").match(/\d+/) || [""])[0];
    }
    socket(live.dataset.ws, (msg, ws) => {
      if (msg.type === "snapshot") {
        const changed = msg.version !== version && version !== -1;
        rows = new Map(msg.entries.map((e) => [e.user, e])); version = msg.version;
        if (changed || msg.version !== Number(live.dataset.version)) render(true);
        live.dataset.version = version;
      } else if (msg.type === "delta") {
        if (msg.version <= version) return; // duplicate
        if (msg.version !== version + 1) { ws.send(JSON.stringify({ type: "resync" })); return; }
        for (const u of msg.removed) rows.delete(u);
        if (msg.shift) { // the other rows ranked first..last (null: to the end) moved by `by`
          const [first, last, by] = msg.shift, moved = new Set(msg.entries.map((e) => e.user));
          for (const [u, e] of rows) if (!moved.has(u) && e.rank >= first && (last === null || e.rank <= last)) rows.set(u, { ...e, rank: e.rank + by });
        }
        for (const e of msg.entries) rows.set(e.user, e);
        version = msg.version; live.dataset.version = version; render(true);
        if (window.kbChartRecord) for (const e of msg.entries) window.kbChartRecord(e);
      }
    }, live);
  }

  // Live submission: timeline and status per run; reload once everything finished for full results.
  const subLive = $("#live-status[data-ws^='/ws/submission/']");
  if (subLive) {
    const order = ["queued", "dispatched", "running"];
    const apply = (r) => {
      const card = $(`section[data-run="${r.run}"]`); if (!card) return;
      card.dataset.status = r.status;
      const badge = $("[data-field=status]", card); badge.textContent = r.status.replace("_", " "); badge.className = "badge s-" + r.status;
      const terminal = !order.includes(r.status);
      for (const li of $$(".timeline li", card)) {
        const step = li.dataset.step, idx = order.indexOf(step), cur = order.indexOf(r.status);
        li.classList.toggle("done", terminal ? (step !== "done" || r.passed) : idx <= cur && idx >= 0 && (idx < cur || step === "queued"));
        li.classList.toggle("now", !terminal && step === r.status);
        li.classList.toggle("bad", terminal && step === "done" && !r.passed);
        const stamp = { queued: r.queued_at, dispatched: r.dispatched_at, running: r.started_at, done: r.finished_at }[step];
        const span = $("span", li);
        if (step === "running" && r.status === "running" && r.progress && r.progress.phase) span.textContent = `${r.progress.phase} ${r.progress.done}/${r.progress.total}`;
        else if (stamp) span.textContent = new Date(stamp).toLocaleTimeString();
      }
    };
    socket(subLive.dataset.ws, (msg) => {
      const runs = msg.type === "snapshot" ? msg.runs : [msg];
      runs.forEach(apply);
      if ($$("section[data-run]").every((c) => !order.includes(c.dataset.status))) setTimeout(() => location.reload(), 300);
    }, subLive);
  }

  // Step charts as inline SVG: x = time, y = score (log scale).
  function chart(el, series, onHover) {
    const W = el.clientWidth || 800, H = 260, P = 48;
    const pts = series.flatMap((s) => s.points);
    if (!pts.length) { el.innerHTML = "<p class='muted'>No passing ranked submissions yet.</p>"; return; }
    const xs = pts.map((p) => +new Date(p[0])), ys = pts.map((p) => Math.log(p[1]));
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1, Date.now()), y0 = Math.min(...ys), y1 = Math.max(...ys, y0 + 1e-9);
    const X = (t) => P + ((t - x0) / (x1 - x0)) * (W - P - 10), Y = (v) => 10 + (1 - (Math.log(v) - y0) / (y1 - y0 || 1)) * (H - 40);
    let svg = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="score over time"><line class="axis" x1="${P}" y1="${H - 30}" x2="${W}" y2="${H - 30}"/>`;
    svg += `<text x="2" y="14">${formatNs(Math.exp(y0) * 1e9)}</text><text x="2" y="${H - 32}">${formatNs(Math.exp(y1) * 1e9)}</text>`;
    svg += `<text x="${P}" y="${H - 12}">${new Date(x0).toLocaleDateString()}</text><text x="${W - 90}" y="${H - 12}">${new Date(x1).toLocaleDateString()}</text>`;
    for (const s of series) {
      let d = "", last = null;
      for (const p of s.points) { const x = X(+new Date(p[0])), y = Y(p[1]); d += last === null ? `M${x},${y}` : `H${x}V${y}`; last = y; }
      d += `H${X(x1)}`;
      svg += `<path class="${s.cls}" d="${d}"><title>${esc(s.label)}</title></path>`;
      for (const p of s.points) svg += `<circle cx="${X(+new Date(p[0]))}" cy="${Y(p[1])}" r="3" class="${s.cls}"><title>${esc(s.label)}: ${formatNs(p[1] * 1e9)} at ${new Date(p[0]).toLocaleString()}${p[2] !== undefined && s.names ? " by " + esc(s.names[p[2]] || "") : ""}</title></circle>`;
    }
    el.innerHTML = svg + "</svg>";
  }
  const chartData = $("#chart-data");
  if (chartData) {
    const data = JSON.parse(chartData.textContent), el = $("#chart");
    const base = { label: "record", cls: "record", points: data.records, names: data.names };
    const draw = (uid) => chart(el, uid && data.users[uid] ? [base, { label: data.userNames[uid], cls: "user", points: data.users[uid] }] : [base]);
    let pinned = null;
    draw(null);
    // a live delta that beats the record extends the progression without a reload
    window.kbChartRecord = (e) => {
      const best = data.records.length ? data.records[data.records.length - 1][1] : Infinity;
      if (e.score < best) { data.records.push([new Date().toISOString(), e.score, e.user]); data.names[e.user] = e.name; draw(pinned); }
    };
    for (const tr of $$("#ranking tr[data-user]")) {
      tr.addEventListener("mouseenter", () => draw(pinned || tr.dataset.user));
      tr.addEventListener("mouseleave", () => draw(pinned));
      tr.addEventListener("click", (e) => { if (e.target.closest("a,summary")) return; pinned = pinned === tr.dataset.user ? null : tr.dataset.user; draw(pinned); });
    }
  }
  const history = $("#history-data");
  if (history) {
    const data = JSON.parse(history.textContent);
    chart($("#chart"), Object.entries(data).map(([label, points], i) => ({ label, points, cls: i ? "user" : "record" })));
  }
})();
