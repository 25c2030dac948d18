// Charts that open with the last hour of stored telemetry (minute rollups, GET /api/v1/telemetry/history/) and
// then go live over the telemetry WebSocket (/ws/telemetry/), drawn with uPlot; and the fleet heatmap.
//
// Markup (rendered by the server, no inline script):
//   <section data-live-telemetry data-mode="devices|flavors" data-devices="ID-OF-JSON-SCRIPT"
//            data-history="/api/v1/telemetry/history/?…"       (the stored hour the charts open with)
//            data-subscribe='[{"subscribe": {"node": 3}}, ...]'>   (system admins watch whole nodes;
//            [data-compact]                                       tenant users are joined to their tenants'
//     <span data-live-status></span>                               devices by the server and send nothing)
//     <div data-device-chart="UUID"></div> ...        (mode "devices": one chart per card)
//     <div data-flavor-chart></div>                   (mode "flavors": average utilisation per flavor)
//   </section>
//   <section data-heatmap> … <span data-heat-uuid="UUID" data-heat-label="… {util} …" aria-label="…"></span> …
//   </section>                                       (a cell's label and colour follow its live readings)
// The JSON script lists the devices: [{uuid, label, flavor, memory_mib, job_millis?, card_allocated_millis?}]; a
// device with job_millis under 1000 is a card the page's job shares with others, drawn as the job's share.
// Each chart element counts what it has drawn in data-history-points (stored minutes), data-live-points
// (samples from the socket) and data-points (both, since the page opened; the window keeps the last hour), so
// people and tests can see it fill and move.

const WINDOW_S = 3600; // the axis spans the data, at most the last hour
const MIN_SPAN_S = 60;
const feeds = new Map();

function cssVar(name, fallback) {
  const value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return value || fallback;
}

// --- one date format per language (docs/console.md): the page's <html data-datetime-format> in uPlot's tokens ---

function utcDate(seconds) {
  return window.uPlot.tzDate(new Date(seconds * 1000), "UTC");
}

export function formatWhen(seconds) {
  const pattern = document.documentElement.dataset.datetimeFormat || "{YYYY}-{MM}-{DD} {HH}:{mm} UTC";
  return window.uPlot.fmtDate(pattern)(utcDate(seconds));
}

function axisTimes(u, splits) {
  // Ticks are times of day in UTC (24 h), the time part of the page's one format; a span of days adds the date.
  const span = u.scales.x.max - u.scales.x.min;
  const tick = window.uPlot.fmtDate(span > 20 * 3600 ? "{MM}-{DD} {HH}:{mm}" : "{HH}:{mm}");
  return splits.map((s) => tick(utcDate(s)));
}

// --- the socket ---------------------------------------------------------------------------------------------

// The portal sends {"type": "telemetry", "nodes": [{"node": id, "sent_at": iso|null, "devices": {uuid: {...}}}]};
// the first frame after subscribing is a snapshot of the latest values. Lists of samples are accepted too.
function toSeconds(at) {
  if (typeof at === "number") return at > 1e12 ? at / 1000 : at;
  if (typeof at === "string" && !Number.isNaN(Date.parse(at))) return Date.parse(at) / 1000;
  return Date.now() / 1000;
}

export function extractSamples(message) {
  if (!message || typeof message !== "object") return [];
  const out = [];
  const add = (uuid, values, parent) => {
    if (!uuid || !values || typeof values !== "object") return;
    out.push({ ...values, uuid, _t: toSeconds(values.sent_at || parent.sent_at || values.at) });
  };
  for (const key of ["devices", "samples"]) {
    const group = message[key];
    if (Array.isArray(group)) group.forEach((s) => add(s && s.uuid, s, message));
    else if (group && typeof group === "object") Object.entries(group).forEach(([uuid, v]) => add(uuid, v, message));
  }
  if (Array.isArray(message.nodes)) message.nodes.forEach((child) => out.push(...extractSamples(child)));
  return out;
}

class TelemetryFeed {
  constructor(path) {
    this.path = path;
    this.listeners = new Set();
    this.subscriptions = [];
    this.backoff = 1000;
    this.state = "connecting";
    this.connect();
  }

  url() {
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${window.location.host}${this.path}`;
  }

  connect() {
    this.socket = new WebSocket(this.url());
    this.socket.addEventListener("open", () => {
      this.backoff = 1000;
      this.setState("open");
      for (const message of this.subscriptions) this.socket.send(JSON.stringify(message));
    });
    this.socket.addEventListener("message", (event) => {
      let message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      const samples = extractSamples(message);
      if (samples.length) for (const listener of this.listeners) listener.onSamples(samples);
    });
    this.socket.addEventListener("close", () => {
      this.setState("closed");
      // Jittered backoff so a restarted server is not hit by every browser at once.
      const delay = this.backoff * (0.75 + Math.random() / 2);
      this.backoff = Math.min(this.backoff * 2, 30000);
      window.setTimeout(() => this.connect(), delay);
    });
  }

  setState(state) {
    this.state = state;
    for (const listener of this.listeners) listener.onState(state);
  }

  subscribe(message) {
    if (!message) return;
    const text = JSON.stringify(message);
    if (this.subscriptions.some((known) => JSON.stringify(known) === text)) return; // two sections, one node
    this.subscriptions.push(message);
    if (this.socket.readyState === WebSocket.OPEN) this.socket.send(text);
  }

  add(listener) { this.listeners.add(listener); listener.onState(this.state); }
}

function feedFor(path) {
  if (!feeds.has(path)) feeds.set(path, new TelemetryFeed(path));
  return feeds.get(path);
}

async function fetchHistory(url) {
  if (!url) return null;
  try {
    const response = await window.fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    return response.ok ? await response.json() : null;
  } catch (e) {
    return null; // the charts still go live
  }
}

// --- charts -------------------------------------------------------------------------------------------------

function baseOptions(element, series, scales, axes, height, legend) {
  const width = Math.max(element.clientWidth || 0, 200);
  const muted = cssVar("--muted", "#888");
  const grid = { stroke: cssVar("--line", "#ddd"), width: 1 };
  return {
    width, height, series, scales,
    tzDate: utcDate,
    axes: axes.map((axis) => ({ stroke: muted, grid, ticks: grid, ...axis })),
    legend: { show: legend, live: true },
    cursor: { drag: { x: false, y: false } },
  };
}

class TimeChart {
  // One uPlot chart: columns [t, series…]; opens with stored minutes (load), then takes live points (push).
  constructor(element, seriesDefs, scales, axes, { height = 190, legend = true, timeLabel = "Time" } = {}) {
    this.element = element;
    this.legend = legend;
    this.timeLabel = timeLabel;
    this.seriesDefs = seriesDefs;
    this.scales = scales;
    this.axes = axes;
    this.height = height;
    this.data = [[], ...seriesDefs.map(() => [])];
    this.historyPoints = 0;
    this.livePoints = 0;
    this.build();
    document.addEventListener("gpupool:theme", () => this.build());
    window.addEventListener("resize", () => this.plot && this.plot.setSize({ width: Math.max(element.clientWidth, 200), height }));
  }

  build() {
    if (!window.uPlot) return;
    if (this.plot) this.plot.destroy();
    const series = [{ label: this.timeLabel, value: (u, t) => (t == null ? "—" : formatWhen(t)) }, ...this.seriesDefs];
    // The axis spans the data (an hour once the history is in), at least a minute so one point is not a year.
    const scales = { ...this.scales, x: { time: true, range: (u, min, max) => [Math.min(min, max - MIN_SPAN_S), max] } };
    const axes = [{ values: axisTimes }, ...this.axes];
    const options = baseOptions(this.element, series, scales, axes, this.height, this.legend);
    this.plot = new window.uPlot(options, this.data, this.element);
  }

  // Stored minutes go before whatever the socket has already delivered.
  load(columns) {
    const times = columns[0] || [];
    const firstLive = this.data[0].length ? this.data[0][0] : Infinity;
    const keep = times.map((t, i) => (t < firstLive ? i : -1)).filter((i) => i >= 0);
    if (!keep.length) return;
    this.data = this.data.map((column, c) => [...keep.map((i) => (columns[c] ? columns[c][i] ?? null : null)), ...column]);
    this.historyPoints += keep.length;
    this.trim();
    this.redraw();
  }

  push(t, values) {
    const xs = this.data[0];
    if (xs.length && t <= xs[xs.length - 1]) t = xs[xs.length - 1] + 0.001; // keep x strictly increasing
    xs.push(t);
    values.forEach((value, i) => this.data[i + 1].push(value ?? null));
    this.livePoints += 1;
    this.trim();
    this.redraw();
  }

  trim() {
    const xs = this.data[0];
    const oldest = xs[xs.length - 1] - WINDOW_S;
    let drop = 0;
    while (drop < xs.length && xs[drop] < oldest) drop += 1;
    if (drop) this.data = this.data.map((column) => column.slice(drop));
  }

  redraw() {
    const dataset = this.element.dataset;
    dataset.historyPoints = String(this.historyPoints);
    dataset.livePoints = String(this.livePoints);
    dataset.points = String(this.historyPoints + this.livePoints);
    if (this.plot) this.plot.setData(this.data);
  }
}

function palette() {
  return [cssVar("--accent", "#2456c8"), cssVar("--ok", "#1b7f3b"), cssVar("--warn", "#c77700"), cssVar("--error", "#b3261e"), "#8e44ad", "#16a2b8"];
}

const percentAxis = { scale: "%", values: (u, v) => v.map((x) => x + "%") };

function memoryPercent(used, total) {
  return total && used != null ? (100 * used) / total : null;
}

// A card the page's job shares: its own share of the card's work is estimated from the allocations (the agent
// reports the card, not each process), the rest is "other jobs' work", never saying whose.
function shareOf(device) {
  const mine = Number(device.job_millis || 0);
  if (!mine || mine >= 1000) return null;
  const allocated = Math.max(Number(device.card_allocated_millis || 0), mine);
  return { allocatedPct: mine / 10, factor: mine / allocated };
}

// What a shared card's chart draws for one reading of the card's utilisation (percent of the whole card): the
// job's estimated part, its allocation, the other jobs' part; null for a card the job holds whole.
export function jobShare(device, utilisation) {
  const share = shareOf(device);
  if (!share) return null;
  const own = utilisation == null ? null : utilisation * share.factor;
  return { own, allocated: share.allocatedPct, others: utilisation == null ? null : utilisation - own };
}

function deviceChart(element, device, labels, compact) {
  const colors = palette();
  const share = shareOf(device);
  // Small multiples draw no legend each: the page shows one for all of them.
  const options = { height: compact ? 120 : 190, legend: !compact, timeLabel: labels.labelTime };
  const scales = { x: { time: true }, "%": { range: [0, 100] }, abs: { auto: true } };
  if (share) {
    const series = [
      { label: labels.labelJobShare || "this job (estimated) %", stroke: colors[0], width: 2, scale: "%" },
      { label: labels.labelJobAllocated || "allocated to this job %", stroke: colors[1], width: 1, dash: [6, 4], fill: colors[1] + "22", scale: "%" },
      { label: labels.labelOthers || "other jobs' work %", stroke: cssVar("--muted", "#888"), width: 1.5, scale: "%" },
    ];
    const values = (sample) => {
      const part = jobShare(device, sample.utilization_pct);
      return [part.own, part.allocated, part.others];
    };
    return { chart: new TimeChart(element, series, scales, [percentAxis], options), values, share };
  }
  const series = [
    { label: labels.labelUtil || "utilisation %", stroke: colors[0], width: 2, scale: "%" },
    { label: labels.labelMemory || "memory %", stroke: colors[1], width: 2, scale: "%" },
  ];
  const axes = [percentAxis];
  if (!compact) {
    series.push(
      { label: labels.labelPower || "power W", stroke: colors[2], width: 1.5, scale: "abs" },
      { label: labels.labelTemp || "temperature °C", stroke: colors[3], width: 1.5, scale: "abs" },
    );
    axes.push({ scale: "abs", side: 1, grid: { show: false } });
  }
  const values = (sample) => {
    const total = sample.memory_total_mib || device.memory_mib;
    const all = [sample.utilization_pct, memoryPercent(sample.memory_used_mib, total), sample.power_w, sample.temperature_c];
    return all.slice(0, series.length);
  };
  return { chart: new TimeChart(element, series, scales, axes, options), values, share: null };
}

function mountDevices(section, devices) {
  const known = new Map(devices.map((d) => [d.uuid, d]));
  const compact = "compact" in section.dataset;
  const labels = section.dataset;
  const charts = new Map();
  for (const element of section.querySelectorAll("[data-device-chart]")) {
    const uuid = element.dataset.deviceChart;
    charts.set(uuid, deviceChart(element, known.get(uuid) || { uuid }, labels, compact));
  }
  const latestText = (entry, sample) => {
    const pct = (x) => `${Math.round(x ?? 0)}%`;
    if (entry.share) {
      const [own] = entry.values(sample);
      return `${labels.labelJobShort || "this job"} ≈ ${pct(own)} · ${labels.labelAllocatedShort || "allocated"} ${pct(entry.share.allocatedPct)}`;
    }
    return `${pct(sample.utilization_pct)} · ${Math.round(sample.temperature_c ?? 0)} °C · ${Math.round(sample.power_w ?? 0)} W`;
  };
  const onHistory = (history) => {
    for (const card of (history && history.devices) || []) {
      const entry = charts.get(card.uuid);
      if (!entry) continue;
      const rows = card.t.map((t, i) => entry.values({
        utilization_pct: card.utilization_pct[i], memory_used_mib: card.memory_used_mib[i],
        memory_total_mib: card.memory_mib, power_w: card.power_w[i], temperature_c: card.temperature_c[i],
      }));
      entry.chart.load([card.t, ...entry.chart.seriesDefs.map((_, s) => rows.map((row) => row[s]))]);
    }
  };
  const onSamples = (samples) => {
    for (const sample of samples) {
      const entry = charts.get(sample.uuid);
      if (!entry) continue;
      entry.chart.push(sample._t, entry.values(sample));
      const latest = section.querySelector(`[data-device-latest="${CSS.escape(sample.uuid)}"]`);
      if (latest) latest.textContent = latestText(entry, sample);
    }
  };
  return { onHistory, onSamples };
}

function mountFlavors(section, devices) {
  const element = section.querySelector("[data-flavor-chart]");
  if (!element) return { onHistory: () => {}, onSamples: () => {} };
  const flavors = [...new Set(devices.map((d) => d.flavor || "—"))];
  const colors = palette();
  const series = flavors.map((name, i) => ({ label: name, stroke: colors[i % colors.length], width: 2, scale: "%" }));
  const scales = { x: { time: true }, "%": { range: [0, 100] } };
  const chart = new TimeChart(element, series, scales, [percentAxis], { timeLabel: section.dataset.labelTime });
  const flavorOf = new Map(devices.map((d) => [d.uuid, d.flavor || "—"]));
  const latest = new Map();
  let lastValues = [];
  // The numbers table is re-rendered by htmx every few seconds: paint the live column again after each swap.
  // Only a chart of the whole pool may: the table's figure is the pool's for everyone, and a tenant's chart
  // averages just the cards its tenants hold (87 % there beside 15 % for the pool read as a contradiction).
  const poolWide = "poolWide" in section.dataset;
  const paintCells = () => poolWide && flavors.forEach((flavor, i) => {
    const cell = document.querySelector(`[data-flavor-util="${CSS.escape(flavor)}"]`);
    if (cell && lastValues[i] != null) cell.textContent = `${lastValues[i].toFixed(0)}%`;
  });
  document.body.addEventListener("htmx:afterSwap", paintCells);
  const onHistory = (history) => {
    const stored = (history && history.flavors) || [];
    const times = [...new Set(stored.flatMap((f) => f.t))].sort((a, b) => a - b);
    const columns = flavors.map((name) => {
      const found = stored.find((f) => f.flavor === name);
      const at = new Map(found ? found.t.map((t, i) => [t, found.utilization_pct[i]]) : []);
      return times.map((t) => at.get(t) ?? null);
    });
    chart.load([times, ...columns]);
  };
  const onSamples = (samples) => {
    let newest = 0;
    for (const sample of samples) {
      if (!flavorOf.has(sample.uuid)) continue;
      latest.set(sample.uuid, sample.utilization_pct ?? 0);
      newest = Math.max(newest, sample._t);
    }
    if (!newest) return;
    const values = flavors.map((flavor) => {
      const readings = [...latest.entries()].filter(([uuid]) => flavorOf.get(uuid) === flavor).map(([, v]) => v);
      return readings.length ? readings.reduce((a, b) => a + b, 0) / readings.length : null;
    });
    chart.push(newest, values);
    lastValues = values;
    paintCells();
  };
  return { onHistory, onSamples };
}

// --- the fleet heatmap: cells coloured by the latest utilisation in 10 % steps (h0…h10), kept live -----------

export function heatClass(utilisation) {
  if (typeof utilisation !== "number" || Number.isNaN(utilisation)) return "hn";
  return "h" + Math.max(0, Math.min(10, Math.round(utilisation / 10)));
}

function mountHeatmap(section) {
  const cells = new Map();
  for (const cell of section.querySelectorAll("[data-heat-uuid]")) {
    cells.set(cell.dataset.heatUuid, cell);
    cell.title = cell.getAttribute("aria-label") || ""; // the hover text, not sent twice in the page
  }
  const noData = section.dataset.labelNoData || "no data";
  const utilised = section.dataset.labelUtilised || "{pct} utilised";
  const onSamples = (samples) => {
    for (const sample of samples) {
      const cell = cells.get(sample.uuid);
      if (!cell) continue;
      const utilisation = sample.utilization_pct;
      const level = heatClass(utilisation);
      cell.classList.remove(...[...cell.classList].filter((name) => /^h(n|\d+)$/.test(name)));
      cell.classList.add(level);
      const reading = level === "hn" ? noData : utilised.replace("{pct}", `${Math.round(utilisation)}%`);
      const label = (cell.dataset.heatLabel || "{util}").replace("{util}", reading);
      cell.setAttribute("aria-label", label);
      cell.title = label;
    }
    section.dataset.liveUpdates = String(Number(section.dataset.liveUpdates || 0) + 1);
  };
  return { onSamples };
}

// --- mounting -----------------------------------------------------------------------------------------------

function subscribeAll(feed, section) {
  if (!section.dataset.subscribe) return;
  let messages = [];
  try { messages = JSON.parse(section.dataset.subscribe); } catch (e) { /* malformed: ignore */ }
  for (const message of Array.isArray(messages) ? messages : [messages]) feed.subscribe(message);
}

export function mountLiveCharts(root) {
  for (const section of root.querySelectorAll("[data-live-telemetry]:not([data-mounted])")) {
    section.dataset.mounted = "1";
    const source = document.getElementById(section.dataset.devices || "");
    const devices = source ? JSON.parse(source.textContent) : [];
    const handle = section.dataset.mode === "flavors" ? mountFlavors(section, devices) : mountDevices(section, devices);
    const status = section.querySelector("[data-live-status]");
    fetchHistory(section.dataset.history).then((history) => {
      handle.onHistory(history);
      section.dataset.historyState = history ? "loaded" : "unavailable";
    });
    const feed = feedFor(section.dataset.wsPath || "/ws/telemetry/");
    feed.add({
      onSamples: handle.onSamples,
      onState: (state) => { if (status) { status.dataset.state = state; status.title = state; } },
    });
    subscribeAll(feed, section);
  }
  for (const section of root.querySelectorAll("[data-heatmap]:not([data-mounted])")) {
    section.dataset.mounted = "1";
    const feed = feedFor(section.dataset.wsPath || "/ws/telemetry/");
    feed.add({ onSamples: mountHeatmap(section).onSamples, onState: () => {} });
    subscribeAll(feed, section);
  }
}
