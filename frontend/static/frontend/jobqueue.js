// The jobs list as a queue view (frontend/templates/frontend/jobs/list.html). No inline scripts: the page opts in
// with data- attributes.
//   [data-job-queue]       the list; data-user keys what this browser remembers per user
//   [data-select-all]      header checkbox: ticks every [data-job-select] row box of the bulk actions
//   [data-column-picker]   checkboxes [data-col-toggle=name] hide/show the cells [data-col=name]
//   [data-saved-filters]   the current query string saved under a name, listed as links
// Hidden columns and saved filters are kept in this browser's localStorage (not on the server), one entry per
// user: "gpupool:jobs:<user id>:hidden-columns" and "gpupool:jobs:<user id>:saved-filters".

function storageKey(root, what) {
  return `gpupool:jobs:${root.dataset.user || "anonymous"}:${what}`;
}

function load(key, fallback) {
  try {
    const value = JSON.parse(window.localStorage.getItem(key));
    return Array.isArray(value) ? value : fallback;
  } catch (e) {
    return fallback;
  }
}

function store(key, value) {
  try { window.localStorage.setItem(key, JSON.stringify(value)); } catch (e) { /* not remembered */ }
}

function setupSelectAll(root) {
  const all = root.querySelector("[data-select-all]");
  if (!all) return;
  const boxes = () => [...root.querySelectorAll("[data-job-select]")];
  const sync = () => {
    const rows = boxes();
    const ticked = rows.filter((box) => box.checked).length;
    all.checked = rows.length > 0 && ticked === rows.length;
    all.indeterminate = ticked > 0 && ticked < rows.length;
  };
  all.addEventListener("change", () => {
    for (const box of boxes()) box.checked = all.checked;
    sync();
  });
  root.addEventListener("change", (event) => {
    if (event.target.matches("[data-job-select]")) sync();
  });
  sync();
}

function setupColumnPicker(root) {
  const picker = root.querySelector("[data-column-picker]");
  if (!picker) return;
  const key = storageKey(root, "hidden-columns");
  const hidden = new Set(load(key, []));
  const apply = () => {
    for (const cell of root.querySelectorAll("table [data-col]")) cell.hidden = hidden.has(cell.dataset.col);
    for (const box of picker.querySelectorAll("[data-col-toggle]")) box.checked = !hidden.has(box.dataset.colToggle);
  };
  picker.addEventListener("change", (event) => {
    const box = event.target.closest("[data-col-toggle]");
    if (!box) return;
    if (box.checked) hidden.delete(box.dataset.colToggle);
    else hidden.add(box.dataset.colToggle);
    store(key, [...hidden]);
    apply();
  });
  picker.hidden = false;
  apply();
}

function currentQuery() {
  const params = new URLSearchParams(window.location.search);
  params.delete("page");
  params.delete("export");
  return params.toString();
}

function setupSavedFilters(root) {
  const box = root.querySelector("[data-saved-filters]");
  if (!box) return;
  const list = box.querySelector("[data-saved-filter-list]");
  const name = box.querySelector("[data-saved-filter-name]");
  const saveButton = box.querySelector("[data-saved-filter-save]");
  const key = storageKey(root, "saved-filters");
  let saved = load(key, []).filter((item) => item && typeof item.name === "string" && typeof item.query === "string");
  const render = () => {
    list.replaceChildren();
    if (!saved.length) {
      const empty = document.createElement("li");
      empty.textContent = list.dataset.empty;
      list.append(empty);
      return;
    }
    saved.forEach((item, index) => {
      const row = document.createElement("li");
      const link = document.createElement("a");
      // Always this page: a stored entry only ever supplies the query string.
      link.href = window.location.pathname + (item.query ? `?${item.query}` : "");
      link.textContent = item.name;
      link.dataset.savedFilter = item.name;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "ghost";
      remove.textContent = list.dataset.removeLabel;
      remove.setAttribute("aria-label", `${list.dataset.removeLabel}: ${item.name}`);
      remove.addEventListener("click", () => {
        saved.splice(index, 1);
        store(key, saved);
        render();
      });
      row.append(link, " ", remove);
      list.append(row);
    });
  };
  const save = () => {
    const label = name.value.trim();
    if (!label) {
      name.focus();
      return;
    }
    saved = saved.filter((item) => item.name !== label);
    saved.push({ name: label, query: currentQuery() });
    store(key, saved);
    name.value = "";
    render();
  };
  saveButton.addEventListener("click", save);
  name.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      save();
    }
  });
  box.hidden = false;
  render();
}

function start() {
  for (const root of document.querySelectorAll("[data-job-queue]")) {
    setupSelectAll(root);
    setupColumnPicker(root);
    setupSavedFilters(root);
  }
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
