// Live charts over the telemetry WebSocket (/ws/telemetry/), drawn with uPlot.
//
// Markup (rendered by the server, no inline script):
//   <section data-live-telemetry data-mode="devices|flavors" data-devices="ID-OF-JSON-SCRIPT"
//            data-subscribe='[{"subscribe": {"node": 3}}, ...]'>   (system admins watch whole nodes;
//            tenant users are joined to their tenants' devices by the server and send nothing)
//     <span data-live-status></span>
//     <div data-device-chart="UUID"></div> ...        (mode "devices": one chart per card)
//     <div data-flavor-chart></div>                   (mode "flavors": average utilisation per flavor)
//   </section>
// The JSON script lists the devices: [{uuid, label, flavor}]. Each element gets data-points (how many
// samples it has drawn) so people and tests can see it moving.

const WINDOW_POINTS = 300; // five minutes at 1 Hz
const feeds = new Map();

function cssVar(name, fallback) {
  const value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return value || fallback;
}

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
    out.push({ ...values, uuid, _t: toSeconds(values.sent_at || parent.sent_at) });
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
    this.subscriptions.push(message);
    if (this.socket.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(message));
  }

  add(listener) { this.listeners.add(listener); listener.onState(this.state); }
}

function feedFor(path) {
  if (!feeds.has(path)) feeds.set(path, new TelemetryFeed(path));
  return feeds.get(path);
}

function baseOptions(element, series, scales, axes) {
  const width = Math.max(element.clientWidth || 0, 280);
  const muted = cssVar("--muted", "#888");
  const grid = { stroke: cssVar("--line", "#ddd"), width: 1 };
  return {
    width, height: 190, series, scales,
    axes: axes.map((axis) => ({ stroke: muted, grid, ticks: grid, ...axis })),
    legend: { live: false },
    cursor: { drag: { x: false, y: false } },
  };
}

class RingChart {
  // One uPlot chart whose series are fed a value per tick; keeps the last WINDOW_POINTS points.
  constructor(element, seriesDefs, scales, axes) {
    this.element = element;
    this.seriesDefs = seriesDefs;
    this.scales = scales;
    this.axes = axes;
    this.data = [[], ...seriesDefs.map(() => [])];
    this.points = 0;
    this.build();
    document.addEventListener("gpupool:theme", () => this.build());
    window.addEventListener("resize", () => this.plot && this.plot.setSize({ width: Math.max(element.clientWidth, 280), height: 190 }));
  }

  build() {
    if (!window.uPlot) return;
    if (this.plot) this.plot.destroy();
    const series = [{}, ...this.seriesDefs];
    // At least the last minute, at most five, so a single point does not stretch the axis over years.
    const scales = { ...this.scales, x: { time: true, range: (u, min, max) => [Math.max(Math.min(min, max - 60), max - WINDOW_POINTS), max] } };
    this.plot = new window.uPlot(baseOptions(this.element, series, scales, this.axes), this.data, this.element);
  }

  push(t, values) {
    const xs = this.data[0];
    if (xs.length && t <= xs[xs.length - 1]) t = xs[xs.length - 1] + 0.001; // keep x strictly increasing
    xs.push(t);
    values.forEach((value, i) => this.data[i + 1].push(value ?? null));
    if (xs.length > WINDOW_POINTS) this.data.forEach((column) => column.shift());
    this.points += 1;
    this.element.dataset.points = String(this.points);
    if (this.plot) this.plot.setData(this.data);
  }
}

function palette() {
  return [cssVar("--accent", "#2456c8"), cssVar("--ok", "#1b7f3b"), cssVar("--warn", "#c77700"), cssVar("--error", "#b3261e"), "#8e44ad", "#16a2b8"];
}

function mountDevices(section, devices) {
  const charts = new Map();
  const colors = palette();
  const labels = section.dataset;
  for (const element of section.querySelectorAll("[data-device-chart]")) {
    const series = [
      { label: labels.labelUtil || "utilisation %", stroke: colors[0], width: 2, scale: "%" },
      { label: labels.labelMemory || "memory %", stroke: colors[1], width: 2, scale: "%" },
      { label: labels.labelPower || "power W", stroke: colors[2], width: 1.5, scale: "abs" },
      { label: labels.labelTemp || "temperature °C", stroke: colors[3], width: 1.5, scale: "abs" },
    ];
    const scales = { x: { time: true }, "%": { range: [0, 100] }, abs: { auto: true } };
    const axes = [{}, { scale: "%", values: (u, v) => v.map((x) => x + "%") }, { scale: "abs", side: 1, grid: { show: false } }];
    charts.set(element.dataset.deviceChart, new RingChart(element, series, scales, axes));
  }
  const known = new Map(devices.map((d) => [d.uuid, d]));
  return (samples) => {
    for (const sample of samples) {
      const chart = charts.get(sample.uuid);
      if (!chart) continue;
      const device = known.get(sample.uuid) || {};
      const total = sample.memory_total_mib || device.memory_mib;
      const memoryPct = total ? (100 * (sample.memory_used_mib || 0)) / total : null;
      chart.push(sample._t, [sample.utilization_pct, memoryPct, sample.power_w, sample.temperature_c]);
      const latest = section.querySelector(`[data-device-latest="${CSS.escape(sample.uuid)}"]`);
      if (latest) latest.textContent = `${Math.round(sample.utilization_pct ?? 0)}% · ${Math.round(sample.temperature_c ?? 0)} °C · ${Math.round(sample.power_w ?? 0)} W`;
    }
  };
}

function mountFlavors(section, devices) {
  const element = section.querySelector("[data-flavor-chart]");
  if (!element) return () => {};
  const flavors = [...new Set(devices.map((d) => d.flavor || "—"))];
  const colors = palette();
  const series = flavors.map((name, i) => ({ label: name, stroke: colors[i % colors.length], width: 2, scale: "%" }));
  const chart = new RingChart(element, series, { x: { time: true }, "%": { range: [0, 100] } }, [{}, { scale: "%", values: (u, v) => v.map((x) => x + "%") }]);
  const flavorOf = new Map(devices.map((d) => [d.uuid, d.flavor || "—"]));
  const latest = new Map();
  let lastValues = [];
  // The numbers table is re-rendered by htmx every few seconds: paint the live column again after each swap.
  const paintCells = () => flavors.forEach((flavor, i) => {
    const cell = document.querySelector(`[data-flavor-util="${CSS.escape(flavor)}"]`);
    if (cell && lastValues[i] != null) cell.textContent = `${lastValues[i].toFixed(0)}%`;
  });
  document.body.addEventListener("htmx:afterSwap", paintCells);
  return (samples) => {
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
}

export function mountLiveCharts(root) {
  for (const section of root.querySelectorAll("[data-live-telemetry]:not([data-mounted])")) {
    section.dataset.mounted = "1";
    const source = document.getElementById(section.dataset.devices || "");
    const devices = source ? JSON.parse(source.textContent) : [];
    const handle = section.dataset.mode === "flavors" ? mountFlavors(section, devices) : mountDevices(section, devices);
    const status = section.querySelector("[data-live-status]");
    const feed = feedFor(section.dataset.wsPath || "/ws/telemetry/");
    feed.add({
      onSamples: handle,
      onState: (state) => { if (status) { status.dataset.state = state; status.title = state; } },
    });
    if (section.dataset.subscribe) {
      let messages = [];
      try { messages = JSON.parse(section.dataset.subscribe); } catch (e) { /* malformed: ignore */ }
      for (const message of Array.isArray(messages) ? messages : [messages]) feed.subscribe(message);
    }
  }
}
