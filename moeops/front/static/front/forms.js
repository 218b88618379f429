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
