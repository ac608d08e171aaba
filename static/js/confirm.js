/*
 * Confirmation before a destructive action: one mechanism for the whole console.
 *
 * A form (or its submit button) with data-confirm="Cancel job 12 (sweep)?" asks
 * that question with the browser's own confirm(). Yes sends the form with
 * confirm=yes; No sends nothing, so nothing changes. Without JavaScript the
 * server gets no confirm=yes and answers a confirmation page instead of acting
 * (npuportal/confirmation.py): the action is never taken unasked.
 */
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var button = event.submitter;
    var question = (button && button.getAttribute("data-confirm")) || form.getAttribute("data-confirm");
    if (!question) {
      return;
    }
    var flag = form.querySelector('input[name="confirm"]');
    if (!window.confirm(question)) {
      event.preventDefault();
      if (flag) {
        flag.remove();
      }
      return;
    }
    if (!flag) {
      flag = document.createElement("input");
      flag.type = "hidden";
      flag.name = "confirm";
      form.appendChild(flag);
    }
    flag.value = "yes";
  });
})();
