// Applies the saved theme before the first paint (a classic script in <head>, so there is no flash).
(function () {
  try {
    var saved = window.localStorage.getItem("gpupool-theme");
    if (saved === "dark" || saved === "light") document.documentElement.setAttribute("data-theme", saved);
  } catch (e) { /* storage disabled: follow prefers-color-scheme */ }
})();
