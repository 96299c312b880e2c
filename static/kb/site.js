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

  // The page as a reload would render it; `selectors` are swapped in place (rows, pager, records, run cards).
  async function swapFromServer(selectors) {
    const response = await fetch(location.pathname + location.search, { credentials: "same-origin" });
    if (!response.ok) return null;
    const doc = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const sel of selectors) {
      const fresh = $(sel, doc), old = $(sel);
      if (fresh && old) old.replaceWith(document.adoptNode(fresh));
    }
    return doc;
  }

  // Live leaderboard: a delta carries the changed rows, the pager and the records rendered by the server as a
  // reload renders them; a snapshot that differs from the page, a version gap or a delta without rows fetches
  // the page's ranking instead.
  const live = $("#live-status[data-ws^='/ws/leaderboard/']");
  if (live && !live.hasAttribute("data-off")) {
    let version = Number(live.dataset.version), fetching = null;
    const refetch = () => {
      fetching = fetching || swapFromServer(["#ranking tbody", "#pager", "#records", "#chart-data", "#rank-basis",
                                             "#ratio-note"]).then((doc) => {
        const fresh = doc && $("#live-status", doc);
        if (fresh) version = Number(fresh.dataset.version), (live.dataset.version = version);
        if (window.kbChartReload) window.kbChartReload();
      }).finally(() => { fetching = null; });
    };
    const swapOuter = (sel, html) => {
      const old = $(sel); if (!old || !html) return;
      const box = document.createElement("div"); box.innerHTML = html;
      const fresh = box.firstElementChild;
      if (old.tagName === "DETAILS" && old.open) fresh.open = true;
      old.replaceWith(fresh);
    };
    const applyDelta = (msg) => {
      const tbody = $("#ranking tbody");
      // the first rows of an empty board: what it ranks on (ratio or time) is the server's to say
      if ($("tr.empty", tbody)) return refetch();
      for (const u of msg.removed) { const tr = $(`tr[data-user="${u}"]`, tbody); if (tr) tr.remove(); }
      if (msg.shift) { // the other rows ranked first..last (null: to the end) moved by `by`
        const [first, last, by] = msg.shift, moved = new Set(msg.entries.map((e) => String(e.user)));
        for (const tr of $$("tr[data-user]", tbody)) {
          const rank = Number(tr.dataset.rank);
          if (moved.has(tr.dataset.user) || rank < first || (last !== null && rank > last)) continue;
          tr.dataset.rank = rank + by; tr.children[0].textContent = rank + by;
        }
      }
      for (const e of msg.entries) {
        const holder = document.createElement("tbody"); holder.innerHTML = msg.rows[String(e.user)];
        const tr = holder.firstElementChild; tr.classList.add("fresh");
        const old = $(`tr[data-user="${e.user}"]`, tbody);
        if (old) old.replaceWith(tr); else tbody.appendChild(tr);
      }
      const rows = $$("tr[data-user]", tbody).sort((a, b) => a.dataset.rank - b.dataset.rank);
      if (!rows.length) return refetch();  // the last entry left: the page's empty row
      if (rows.length < Math.min(50, msg.entrants || 0)) return refetch();  // rows moved up from the next page
      for (const tr of $$(":scope > tr:not([data-user])", tbody)) tr.remove();
      rows.forEach((tr, i) => (i < 50 ? tbody.appendChild(tr) : tr.remove()));
      swapOuter("#pager", msg.pager);
      swapOuter("#records", msg.records_html);
      if (window.kbChartRecords) window.kbChartRecords(msg.records, msg.record_names, msg.records_on_ratio);
      const list = $("#records ul");
      if (msg.record_added && list) { // one record appended to the progression
        list.insertAdjacentHTML("beforeend", msg.record_html);
        $("#records summary").textContent = `Records (${$$("li", list).length})`;
        if (window.kbChartRecordAdded) window.kbChartRecordAdded(msg.record_added, msg.record_names, msg.records_on_ratio);
      }
    };
    // the final standings started, moved on, or were published: the banner and the table as a reload shows them,
    // and the board's name and deadline line (closed now, its deadline as the organiser last set it, no submit
    // button) (an event during a fetch fetches again after it; a snapshot names the standings shown, for a missed
    // event)
    let finalFetch = null, finalAgain = false;
    const refetchFinal = () => {
      if (finalFetch) { finalAgain = true; return; }
      finalFetch = swapFromServer(["#final", "#ranking-title", "#board-name", "#board-meta"]).then(tick).finally(() => {
        finalFetch = null;
        if (finalAgain) { finalAgain = false; refetchFinal(); }
      });
    };
    socket(live.dataset.ws, (msg) => {
      if (msg.type === "final") {
        refetchFinal();
      } else if (msg.type === "snapshot") {
        if (msg.version !== version) refetch();
        const shown = $("#final");
        if (shown && msg.final !== undefined && msg.final !== shown.dataset.state) refetchFinal();
      } else if (msg.type === "delta") {
        if (msg.version <= version) return; // duplicate
        const complete = msg.rows && msg.entries.every((e) => msg.rows[String(e.user)]);
        if (msg.version !== version + 1 || !complete || fetching) { refetch(); return; }
        version = msg.version; live.dataset.version = version;
        applyDelta(msg);
      }
    }, live);
  }

  // Live submission: badge, timeline and progress per run from the websocket; when a run finishes (or is
  // requeued), its card and the score are fetched as a reload renders them, so each run's results appear as
  // soon as it ends and a requeued run shows no earlier attempt's.
  const subLive = $("#live-status[data-ws^='/ws/submission/']");
  if (subLive) {
    const order = ["queued", "dispatched", "running"];
    const isTerminal = (status) => !order.includes(status);
    const phases = { test: "tests", benchmark: "benchmarks", ranked: "ranked benchmarks" };  // as kb.progress_text
    const hhmmss = (iso) => new Date(iso).toISOString().slice(11, 19);  // UTC, as the page renders it
    const apply = (r) => {
      const card = $(`section[data-run="${r.run}"]`); if (!card) return;
      const was = card.dataset.status;
      card.dataset.status = r.status;
      const badge = $("[data-field=status]", card);
      badge.textContent = r.status.split("_").map((w) => w[0].toUpperCase() + w.slice(1)).join(" ");  // as Django labels it
      badge.className = "badge s-" + r.status;
      const terminal = isTerminal(r.status);
      for (const li of $$(".timeline li", card)) {
        const step = li.dataset.step, idx = order.indexOf(step), cur = order.indexOf(r.status);
        const stopped = r.status === "cancelled";  // an organiser's cancel is no failure of the submission
        li.classList.toggle("done", terminal ? (step !== "done" || r.passed) : idx <= cur && idx >= 0 && (idx < cur || step === "queued"));
        li.classList.toggle("now", !terminal && step === r.status);
        li.classList.toggle("bad", terminal && step === "done" && !r.passed && !stopped);
        li.classList.toggle("stopped", terminal && step === "done" && stopped);
        const stamp = { queued: r.queued_at, dispatched: r.dispatched_at, running: r.started_at, done: r.finished_at }[step];
        $("span", li).textContent = stamp ? hhmmss(stamp) : "";
      }
      const line = $("[data-field=progress]", card), p = r.progress || {};
      line.hidden = terminal || !p.phase;
      if (p.phase) {
        $("progress", line).max = p.total || 1; $("progress", line).value = p.done || 0;
        $("span", line).textContent = `${phases[p.phase] || p.phase} ${p.done}/${p.total}`;
      }
      if (r.status !== "queued") for (const note of $$(".flash.queued-note")) note.remove();
      if (was && was !== r.status && (terminal || isTerminal(was))) {
        swapFromServer([`section[data-run="${r.run}"]`, "#scores"]).then(() => {
          if ($$("section[data-run]").every((c) => isTerminal(c.dataset.status))) subLive.textContent = "finished";
        });
      }
    };
    socket(subLive.dataset.ws, (msg) => {
      (msg.type === "snapshot" ? msg.runs : [msg]).forEach(apply);
    }, subLive);
  }

  // Copy buttons (a new token): the clipboard API where the page may use it, else the text selected for Ctrl+C.
  document.querySelectorAll("button[data-copy]").forEach((button) => button.addEventListener("click", async () => {
    const source = $(button.dataset.copy), text = source.textContent.trim();
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "Copied";
    } catch {
      const range = document.createRange();
      range.selectNodeContents(source);
      getSelection().removeAllRanges();
      getSelection().addRange(range);
      button.textContent = "Selected: press Ctrl+C";
    }
  }));

  // The submit form offers the chosen leaderboard's GPU types only.
  const boardSelect = $("select[name=leaderboard][data-gpus]"), gpuSelect = $("select[name=gpu]");
  if (boardSelect && gpuSelect) {
    const gpusOf = JSON.parse(boardSelect.dataset.gpus);
    boardSelect.addEventListener("change", () => {
      const was = gpuSelect.value;
      gpuSelect.innerHTML = (gpusOf[boardSelect.value] || []).map(([value, label]) =>
        `<option value="${esc(value)}"${value === was ? " selected" : ""}>${esc(label)}</option>`).join("");
      // only the chosen board's GPU types' "unavailable" banners
      const mine = new Set((gpusOf[boardSelect.value] || []).map(([value]) => value));
      document.querySelectorAll("[data-unavailable]").forEach((b) => { b.hidden = !mine.has(b.dataset.unavailable); });
    });
  }

  // Step charts as inline SVG: x = time, y = the figure (log scale): the time, or with onRatio the ratio to the
  // reference a board ranks on, so the lowest record is rank 1.
  // a name in a label between FIRST STRONG ISOLATE and POP DIRECTIONAL ISOLATE: its U+202E turns nothing after it
  const isolated = (text) => `\u2068${text}\u2069`;
  const when = (t, withTime) => new Date(t).toLocaleString(undefined, withTime
    ? { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" } : { year: "numeric", month: "short", day: "numeric" });
  function chart(el, series, onRatio) {
    const W = el.clientWidth || 800, H = 260, P = 48, T = 26;  // T: the plot starts below the title line
    const fig = (v) => onRatio ? `${v.toFixed(v < 10 ? 3 : 1)}×` : formatNs(v * 1e9);
    const pts = series.flatMap((s) => s.points);
    if (!pts.length) { el.innerHTML = "<p class='muted'>No passing ranked submissions yet.</p>"; return; }
    const xs = pts.map((p) => +new Date(p[0])), ys = pts.map((p) => Math.log(p[1]));
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1, Date.now()), y0 = Math.min(...ys), y1 = Math.max(...ys, y0 + 1e-9);
    const X = (t) => P + ((t - x0) / (x1 - x0)) * (W - P - 10), Y = (v) => T + (1 - (Math.log(v) - y0) / (y1 - y0 || 1)) * (H - 30 - T);
    const what = onRatio ? "ratio to the reference (what the board ranks on)" : "time";
    let svg = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${what} over time, lower is better"><line class="axis" x1="${P}" y1="${H - 30}" x2="${W}" y2="${H - 30}"/>`;
    // the slowest at the top, the fastest at the bottom, as Y places them
    svg += `<text x="2" y="${T + 4}" class="y-top">${fig(Math.exp(y1))}</text><text x="2" y="${H - 32}" class="y-bottom">${fig(Math.exp(y0))}</text>`;
    svg += `<text x="${W - 4}" y="14" text-anchor="end" class="y-title">${onRatio ? "× reference" : "time"}, lower is better</text>`;
    // the first point's moment and "now" (the right edge): a span under two days shows the hour
    const short = x1 - x0 < 2 * 86400e3;
    svg += `<text x="${P}" y="${H - 12}" class="x-start">${when(x0, short)}</text><text x="${W - 4}" y="${H - 12}" text-anchor="end" class="x-end">${x1 >= Date.now() - 60e3 ? "now" : when(x1, short)}</text>`;
    for (const s of series) {
      let d = "", last = null;
      for (const p of s.points) { const x = X(+new Date(p[0])), y = Y(p[1]); d += last === null ? `M${x},${y}` : `H${x}V${y}`; last = y; }
      d += `H${X(x1)}`;
      svg += `<path class="${s.cls}" d="${d}"><title>${esc(s.label)}</title></path>`;
      for (const p of s.points) svg += `<circle cx="${X(+new Date(p[0]))}" cy="${Y(p[1])}" r="3" class="${s.cls}"><title>${esc(s.label)}: ${fig(p[1])} at ${new Date(p[0]).toLocaleString()}${p[2] !== undefined && s.names ? " by " + esc(isolated(s.names[p[2]] || "")) : ""}</title></circle>`;
    }
    el.innerHTML = svg + "</svg>";
  }
  const chartData = $("#chart-data");
  if (chartData) {
    let data = JSON.parse(chartData.textContent), pinned = null;
    const el = $("#chart");
    const draw = (uid) => {
      const base = { label: "record", cls: "record", points: data.records, names: data.names };
      chart(el, uid && data.users[uid] ? [base, { label: isolated(data.userNames[uid]), cls: "user", points: data.users[uid] }] : [base],
            data.onRatio);
    };
    draw(null);
    // live deltas carry the record progression as the server computes it for a reload
    window.kbChartRecords = (records, names, onRatio) => { if (records) { data.records = records; data.onRatio = !!onRatio; Object.assign(data.names, names || {}); draw(pinned); } };
    window.kbChartRecordAdded = (record, names, onRatio) => { data.records.push(record); data.onRatio = !!onRatio; Object.assign(data.names, names); draw(pinned); };
    window.kbChartReload = () => { data = JSON.parse($("#chart-data").textContent); draw(pinned); };
    const ranking = $("#ranking"), rowOf = (e) => e.target.closest("tr[data-user]");
    ranking.addEventListener("mouseover", (e) => { const tr = rowOf(e); if (tr) draw(pinned || tr.dataset.user); });
    ranking.addEventListener("mouseleave", () => draw(pinned));
    ranking.addEventListener("click", (e) => {
      const tr = rowOf(e); if (!tr || e.target.closest("a,summary")) return;
      pinned = pinned === tr.dataset.user ? null : tr.dataset.user; draw(pinned);
    });
  }
  const history = $("#history-data");
  if (history) {
    const data = JSON.parse(history.textContent);
    chart($("#chart"), Object.entries(data.series).map(([label, points], i) => ({ label, points, cls: i ? "user" : "record" })),
          data.onRatio);
  }
})();
