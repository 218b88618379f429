// Draws every element with data-figure="<id of a json_script holding {data, layout}>";
// moeopsCharts.update(elementId, figure) redraws one in place (live progress).
(function () {
  var config = {responsive: true, displaylogo: false};

  function render(el, fig) {
    if (!fig.data || fig.data.length === 0) {
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
