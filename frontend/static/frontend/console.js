// The console's one script. No inline scripts anywhere: pages opt in to behaviour with data- attributes.
//   [data-theme-toggle]        button that switches light/dark and remembers the choice
//   select[data-autosubmit]    submits its form on change (language switcher)
//   [data-confirm]             asks before a destructive submit (cordon, drain, cancel)
//   [data-live-telemetry]      a live chart area fed by the telemetry WebSocket (see telemetry.js)
//   [data-job-log]             a job's output, followed live, paused, downloaded (see joblog.js)
import { mountJobLogs } from "./joblog.js";
import { mountLiveCharts } from "./telemetry.js";

function setupThemeToggle() {
  const root = document.documentElement;
  const prefersDark = window.matchMedia("(prefers-color-scheme: dark)");
  const effective = () => root.getAttribute("data-theme") || (prefersDark.matches ? "dark" : "light");
  for (const button of document.querySelectorAll("[data-theme-toggle]")) {
    const render = () => {
      const dark = effective() === "dark";
      button.setAttribute("aria-pressed", String(dark));
      button.textContent = dark ? button.dataset.labelLight : button.dataset.labelDark;
    };
    button.addEventListener("click", () => {
      const next = effective() === "dark" ? "light" : "dark";
      root.setAttribute("data-theme", next);
      try { window.localStorage.setItem("gpupool-theme", next); } catch (e) { /* not remembered */ }
      render();
      document.dispatchEvent(new CustomEvent("gpupool:theme"));
    });
    prefersDark.addEventListener("change", render);
    render();
  }
}

function setupAutosubmit() {
  for (const select of document.querySelectorAll("select[data-autosubmit]")) {
    select.addEventListener("change", () => select.form && select.form.requestSubmit());
  }
}

function setupConfirm() {
  document.addEventListener("submit", (event) => {
    const form = event.target;
    const message = form.dataset && form.dataset.confirm;
    if (message && !window.confirm(message)) event.preventDefault();
  }, true);
}

function start() {
  setupThemeToggle();
  setupAutosubmit();
  setupConfirm();
  mountLiveCharts(document);
  mountJobLogs(document);
  // Fragments that htmx swaps in may carry charts too.
  document.body.addEventListener("htmx:afterSwap", (event) => mountLiveCharts(event.target));
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
