// Draws every element with data-figure="<id of a json_script holding {data, layout}>";
// moeopsCharts.update(elementId, figure) redraws one in place (live progress).
(function () {
  var config = {responsive: true, displaylogo: false};
  // plotly follows the window's size only; a chart whose box changes otherwise (a chart beside
  // it in the grid shown or hidden as a live run fills in) is resized to its box
  var resizes = window.ResizeObserver ? new ResizeObserver(function (entries) {
    entries.forEach(function (entry) {
      if (entry.target.classList.contains("js-plotly-plot") && entry.contentRect.width > 0) {
        Plotly.Plots.resize(entry.target);
      }
    });
  }) : null;

  // A chart marked hide-empty stays hidden (its section too) until it has data; the page's
  // one "waiting for the first level" line shows while none has.
  function showWaiting() {
    var waiting = document.getElementById("waiting-first-level");
    if (!waiting) { return; }
    var drawn = document.querySelector("section:not([hidden]) > .hide-empty");
    waiting.hidden = Boolean(drawn);
  }

  function render(el, fig) {
    var empty = !fig.data || fig.data.length === 0;
    if (el.classList.contains("hide-empty")) {
      var box = el.closest("section") || el;
      box.hidden = empty;
      if (empty) {
        if (el.classList.contains("js-plotly-plot")) { Plotly.purge(el); }
        showWaiting();
        return;
      }
    }
    if (empty) {
      if (el.classList.contains("js-plotly-plot")) { Plotly.purge(el); }
      el.classList.add("chart-empty");
      el.textContent = el.dataset.empty || "No data to chart yet.";
      return;
    }
    if (el.classList.contains("chart-empty")) {
      el.classList.remove("chart-empty");
      el.textContent = "";
    }
    Plotly.react(el, fig.data, fig.layout, config);
    if (resizes) { resizes.observe(el); }
    showWaiting();
  }

  function draw(el) {
    var source = document.getElementById(el.dataset.figure);
    if (source) { render(el, JSON.parse(source.textContent)); }
  }

  document.querySelectorAll("[data-figure]").forEach(draw);
  window.moeopsCharts = {
    update: function (elementId, fig) {
      var el = document.getElementById(elementId);
      if (el) { render(el, fig); }
    }
  };
})();
