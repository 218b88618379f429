// Draws every element with data-figure="<id of a json_script holding {data, layout}>".
(function () {
  function draw(el) {
    var source = document.getElementById(el.dataset.figure);
    if (!source) { return; }
    var fig = JSON.parse(source.textContent);
    if (!fig.data || fig.data.length === 0) {
      el.classList.add("chart-empty");
      el.textContent = "No data to chart yet.";
      return;
    }
    Plotly.newPlot(el, fig.data, fig.layout, {responsive: true, displaylogo: false});
  }
  document.querySelectorAll("[data-figure]").forEach(draw);
  window.moeopsDraw = draw;
})();
