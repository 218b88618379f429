// Fields marked data-autosubmit save their form as soon as they change (the plan's statuses,
// the compare page's grouping); data-autosubmit="<value>" presses the button with that value.
(function () {
  document.querySelectorAll("[data-autosubmit]").forEach(function (field) {
    field.addEventListener("change", function () {
      var value = field.dataset.autosubmit;
      var button = value && field.form.querySelector("button[value='" + value + "']");
      if (button) { button.click(); } else { field.form.requestSubmit(); }
    });
  });
})();

// The sweep and capacity forms' estimated duration, asked of the server (one formula,
// moeops.runs.estimate) and written into the form's line: refresh asks now, later once the
// typing has paused for 250 ms.
function estimateAsker(form, line) {
  var timer = null;
  function refresh() {
    var query = new URLSearchParams(new FormData(form));
    query.delete("csrfmiddlewaretoken");
    fetch(line.dataset.estimateUrl + "?" + query.toString(), {credentials: "same-origin"})
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (body) { if (body) { line.textContent = body.text; } });
  }
  function later() {
    window.clearTimeout(timer);
    timer = window.setTimeout(refresh, 250);
  }
  return {refresh: refresh, later: later};
}

// The sweep form: a preset fills the load fields; any change asks for the estimated duration.
function sweepFormReady() {
  var form = document.getElementById("sweep-form");
  var line = document.getElementById("sweep-estimate");
  if (!form || !line) { return; }
  var estimate = estimateAsker(form, line);
  var refresh = estimate.refresh;
  form.addEventListener("input", estimate.later);
  // A workload whose file sets the output lengths: the output field is emptied and says so
  // (its pre-filled number would read as the sweep's output length); a trace sets the input
  // lengths too.
  var workload = form.elements["workload"];
  var lengths = {output_len: "output", input_len: "input"};
  function fromFile(name) {
    var option = workload && workload.selectedOptions[0];
    return option ? option.dataset[lengths[name]] : undefined;
  }
  function showLengths() {
    Object.keys(lengths).forEach(function (name) {
      var field = form.elements[name];
      if (!field) { return; }
      var said = fromFile(name);
      field.placeholder = said || "";
      if (said) { field.value = ""; }
    });
  }
  if (workload) {
    workload.addEventListener("change", function () { showLengths(); refresh(); });
  }
  form.querySelectorAll("[data-sweep-preset]").forEach(function (button) {
    button.addEventListener("click", function () {
      ["levels", "input_len", "output_len", "prompts_per_level", "warmup"].forEach(function (name) {
        var field = form.elements[name];
        if (field && !(lengths[name] && fromFile(name))) { field.value = button.dataset[name]; }
      });
      refresh();
    });
  });
}

// The capacity form: opening it, and any change, asks the server for the search's estimated
// duration (moeops.runs.estimate.capacity_plan); asked only once the form is open, so that the
// deployment page itself costs no query for it.
function capacityFormReady() {
  var form = document.getElementById("capacity-form");
  var line = document.getElementById("capacity-estimate");
  if (!form || !line) { return; }
  var details = form.closest("details");
  var estimate = estimateAsker(form, line);
  var refresh = estimate.refresh;
  form.addEventListener("input", estimate.later);
  if (details) {
    details.addEventListener("toggle", function () { if (details.open) { refresh(); } });
    if (details.open) { refresh(); }
  } else {
    refresh();
  }
}

// The deployment page's sweep, capacity and watch forms read lists of their own (workloads,
// SLO profiles, alert channels): each is asked of the server when its section is first opened,
// unless the page came with it (refused, with its errors).
var formsReady = {"sweep-form": sweepFormReady, "capacity-form": capacityFormReady};
sweepFormReady();
capacityFormReady();
document.querySelectorAll("details[data-form-url]").forEach(function (details) {
  var slot = details.querySelector(".form-slot");
  if (!slot) { return; }
  var asked = false;
  function ask() {
    if (!details.open || asked) { return; }
    asked = true;
    slot.textContent = "Opening the form…";
    fetch(details.dataset.formUrl, {credentials: "same-origin"})
      .then(function (response) {
        if (!response.ok) { throw new Error("the server answered " + response.status); }
        return response.text();
      })
      .then(function (html) {
        var holder = document.createElement("div");
        holder.innerHTML = html;
        var form = holder.firstElementChild;
        slot.replaceWith(form);
        if (formsReady[form.id]) { formsReady[form.id](); }
      })
      .catch(function (error) {
        asked = false;
        slot.textContent = "The form could not be opened (" + error.message + "): close and open this section to try again.";
      });
  }
  details.addEventListener("toggle", ask);
  ask();
});

// A plan item's title wraps in its box instead of being cut; Enter saves it as the input did.
(function () {
  document.querySelectorAll("textarea.plan-title").forEach(function (box) {
    box.addEventListener("keydown", function (event) {
      if (event.key !== "Enter" || event.shiftKey) { return; }
      event.preventDefault();
      box.form.requestSubmit(box.form.querySelector("button[value='save']"));
    });
  });
})();
