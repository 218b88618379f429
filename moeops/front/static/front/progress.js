// Live progress: every [data-progress-url] element polls its JSON status every 1.5 s and
// updates its bar, its text, elapsed and ETA; with data-figures it also redraws the page's
// charts, which the server sends only when they changed since data-figures-key. When the run
// ends the page reloads once (after a moment at 100 %) so its tables show the final numbers.
(function () {
  var INTERVAL_MS = 1500;
  var RELOAD_DELAY_MS = 1200;

  function duration(seconds) {
    if (seconds === null || seconds === undefined) { return "—"; }
    var s = Math.round(seconds);
    if (s < 60) { return s + " s"; }
    var m = Math.floor(s / 60); s = s % 60;
    if (m < 60) { return m + " min " + String(s).padStart(2, "0") + " s"; }
    var h = Math.floor(m / 60); m = m % 60;
    return h + " h " + String(m).padStart(2, "0") + " min";
  }

  function set(box, selector, text) {
    var el = box.querySelector(selector);
    if (el) { el.textContent = text; }
  }

  function show(box, state) {
    var p = state.progress;
    var pct = p.fraction === null ? null : Math.round(p.fraction * 1000) / 10;
    var bar = box.querySelector(".bar > span");
    if (bar) {
      bar.style.width = (pct === null ? 0 : pct) + "%";
      bar.parentElement.classList.toggle("indeterminate", pct === null);
      bar.parentElement.setAttribute("aria-valuenow", pct === null ? "" : String(pct));
    }
    set(box, ".progress-pct", pct === null ? "" : pct.toFixed(pct < 10 ? 1 : 0) + "%");
    set(box, ".progress-text", p.text || "");
    set(box, ".progress-elapsed", duration(p.elapsed_s));
    set(box, ".progress-eta", duration(p.eta_s));
    // the box's own badge and the page heading's ([data-live-status]) follow the run
    var badges = Array.from(box.querySelectorAll(".status"));
    if (box.dataset.figures) {
      badges = badges.concat(Array.from(document.querySelectorAll("[data-live-status]")));
    }
    badges.forEach(function (badge) {
      badge.textContent = state.status_display;
      badge.className = "status status-" + state.status;
    });
    box.dataset.status = state.status;
    if (state.cancel_requested) { box.classList.add("cancel-requested"); }
    // the charts and table of the poll come only when drawn from something new (figures_key)
    if (state.figures_key) { box.dataset.figuresKey = state.figures_key; }
    if (state.figures) {
      Object.keys(state.figures).forEach(function (key) {
        window.moeopsCharts.update(key, state.figures[key]);
      });
    }
    if (typeof state.levels_html === "string") { showLevels(state.levels_html); }
  }

  // The run page's per-level table, as the server renders it with the charts of the same poll;
  // redrawn only when it changed (a redraw would reset its scroll), keeping "All columns".
  var shownLevels = null;
  function showLevels(html) {
    var table = document.getElementById("levels-table");
    if (!table || html === shownLevels) { return; }
    var all = document.getElementById("all-columns");
    var ticked = Boolean(all && all.checked);
    table.innerHTML = html;
    all = document.getElementById("all-columns");
    if (all) { all.checked = ticked; }
    shownLevels = html;
  }

  function poll(box) {
    var url = box.dataset.progressUrl;
    if (box.dataset.figures) {
      url += "?figures=1";
      if (box.dataset.figuresKey) { url += "&since=" + encodeURIComponent(box.dataset.figuresKey); }
    }
    fetch(url, {headers: {"Accept": "application/json"}, credentials: "same-origin"})
      .then(function (response) {
        if (!response.ok) { throw new Error("status " + response.status); }
        return response.json();
      })
      .then(function (state) {
        show(box, state);
        if (state.finished) {
          if (box.dataset.reloadWhenDone) {
            window.setTimeout(function () { window.location.reload(); }, RELOAD_DELAY_MS);
          }
          return;
        }
        window.setTimeout(function () { poll(box); }, INTERVAL_MS);
      })
      .catch(function () {
        // A missed poll (server restarting, network blip) is retried, slower.
        box.classList.add("stale");
        window.setTimeout(function () { poll(box); }, INTERVAL_MS * 4);
      });
  }

  document.querySelectorAll("[data-progress-url]").forEach(function (box) {
    if (box.dataset.status === "queued" || box.dataset.status === "running") {
      window.setTimeout(function () { poll(box); }, INTERVAL_MS);
    }
  });
})();
