// The job page's output: the last lines first, then what the run writes, until it is complete.
// One small request every two seconds while the job runs (GET /api/v1/jobs/<id>/log/?offset=N);
// none once the run's output is complete. Scrolls along only while the reader is at the bottom.
// A job that has not started yet has no output: following begins when the page's live region
// (htmx, templates/live/job.html) says it started, with no reload.
(function () {
  "use strict";
  var box = document.getElementById("job-output");
  if (!box) { return; }
  var status = document.getElementById("job-output-status");
  var url = box.getAttribute("data-log-url");
  var interval = 2000;
  var query = "?tail=" + (box.getAttribute("data-tail") || "500");
  var attempt = null;

  function say(text) { if (status) { status.textContent = text; } }

  function step() {
    fetch(url + query, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.json().then(function (body) { return [r.ok, body]; }); })
      .then(function (pair) {
        var ok = pair[0], chunk = pair[1];
        if (!ok) { say(chunk.error || "output unavailable"); return; }
        var atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
        if (chunk.data) { box.textContent += chunk.data; }
        if (atBottom) { box.scrollTop = box.scrollHeight; }
        attempt = chunk.attempt;
        box.setAttribute("data-next-offset", String(chunk.next_offset));
        if (chunk.complete) {
          say((chunk.note ? chunk.note + " · " : "") + (box.textContent ? "complete" : "no output"));
          box.setAttribute("data-complete", "true");
          return;
        }
        say(chunk.note || "following…");
        query = "?offset=" + chunk.next_offset + (attempt ? "&attempt=" + attempt : "");
        window.setTimeout(step, interval);
      })
      .catch(function () { say("could not reach the server; retrying"); window.setTimeout(step, interval * 2); });
  }
  function started() {
    var marker = document.getElementById("job-started");
    return !marker || marker.getAttribute("data-started") === "yes";
  }
  var begun = false;
  function begin() {
    if (begun || !started()) { return; }
    begun = true;
    say("loading…");
    step();
  }
  document.body.addEventListener("htmx:afterSettle", begin);
  begin();
})();
