// The job page's output: the last lines first, then what the run writes, until it is complete.
// One small request every two seconds while the job runs (GET /api/v1/jobs/<id>/log/?offset=N);
// none once the run's output is complete. Scrolls along only while the reader is at the bottom.
// A job that has not started yet has no output: following begins when the page's live region
// (htmx, templates/live/job.html) says it started, with no reload.
//
// The output is shown as a terminal shows it (Terminal, below): colours (ANSI SGR) as spans with
// classes, a "\r" returns to the start of the line so a progress bar (tqdm) shows its last state,
// other escape sequences are dropped, never shown as "[31m". Output is hostile text: it only ever
// reaches the page through textContent, never as markup.
(function () {
  "use strict";

  // -- the terminal ---------------------------------------------------------------------------

  var CSI_PARAM = /[0-?]/, CSI_INTER = /[ -\/]/, CSI_FINAL = /[@-~]/;
  //: An unfinished escape sequence longer than this is not one: it is dropped, not waited for.
  var MAX_ESCAPE = 256;

  function Terminal(box) {
    this.box = box;
    this.cells = [];      // the current line: [{ch, cls}]
    this.col = 0;         // the cursor's column in it
    this.lineEl = null;   // the current line's element (re-drawn on each write)
    this.pending = "";    // an escape sequence cut between two chunks
    this.resetStyle();
    this.newlines = 0;    // "\n" written so far
    this.open = false;    // the last line has text but no "\n" yet
  }

  Terminal.prototype.resetStyle = function () {
    this.fg = null; this.bg = null;
    this.bold = false; this.dim = false; this.italic = false; this.underline = false; this.inverse = false;
  };

  Terminal.prototype.cls = function () {
    var names = [];
    var fg = this.inverse ? this.bg : this.fg, bg = this.inverse ? this.fg : this.bg;
    if (this.inverse && fg === null) { fg = "inv"; }
    if (this.inverse && bg === null) { bg = "inv"; }
    if (fg !== null) { names.push("ansi-fg-" + fg); }
    if (bg !== null) { names.push("ansi-bg-" + bg); }
    if (this.bold) { names.push("ansi-bold"); }
    if (this.dim) { names.push("ansi-dim"); }
    if (this.italic) { names.push("ansi-italic"); }
    if (this.underline) { names.push("ansi-underline"); }
    return names.join(" ");
  };

  Terminal.prototype.sgr = function (params) {
    var codes = params === "" ? [0] : params.split(/[;:]/).map(function (p) { return p === "" ? 0 : parseInt(p, 10); });
    for (var i = 0; i < codes.length; i++) {
      var c = codes[i];
      if (c === 0) { this.resetStyle(); }
      else if (c === 1) { this.bold = true; }
      else if (c === 2) { this.dim = true; }
      else if (c === 3) { this.italic = true; }
      else if (c === 4) { this.underline = true; }
      else if (c === 7) { this.inverse = true; }
      else if (c === 22) { this.bold = false; this.dim = false; }
      else if (c === 23) { this.italic = false; }
      else if (c === 24) { this.underline = false; }
      else if (c === 27) { this.inverse = false; }
      else if (c >= 30 && c <= 37) { this.fg = c - 30; }
      else if (c >= 90 && c <= 97) { this.fg = c - 90 + 8; }
      else if (c === 39) { this.fg = null; }
      else if (c >= 40 && c <= 47) { this.bg = c - 40; }
      else if (c >= 100 && c <= 107) { this.bg = c - 100 + 8; }
      else if (c === 49) { this.bg = null; }
      else if (c === 38 || c === 48) {
        // 256 colours (5;n): the first 16 are the named ones; true colour (2;r;g;b) is not kept.
        var mode = codes[i + 1];
        if (mode === 5) {
          var n = codes[i + 2];
          if (n >= 0 && n < 16) { if (c === 38) { this.fg = n; } else { this.bg = n; } }
          i += 2;
        } else if (mode === 2) { i += 4; }
      }
    }
  };

  Terminal.prototype.csi = function (params, final) {
    var n = parseInt(params, 10);
    if (final === "m") { this.sgr(params); }
    else if (final === "K") {  // erase in line
      if (!n) { this.cells.length = Math.min(this.cells.length, this.col); }
      else if (n === 1) { for (var i = 0; i <= this.col && i < this.cells.length; i++) { this.cells[i] = { ch: " ", cls: "" }; } }
      else if (n === 2) { this.cells = []; }
    }
    else if (final === "G") { this.col = Math.max(0, (n || 1) - 1); }      // to column n
    else if (final === "C") { this.col += n || 1; }                         // forward
    else if (final === "D") { this.col = Math.max(0, this.col - (n || 1)); } // back
    // Anything else (cursor up, clear screen, ...) moves what a log cannot show: dropped.
  };

  Terminal.prototype.put = function (ch) {
    while (this.cells.length < this.col) { this.cells.push({ ch: " ", cls: "" }); }
    this.cells[this.col] = { ch: ch, cls: this.cls() };
    this.col += 1;
  };

  Terminal.prototype.draw = function () {
    if (!this.lineEl) {
      this.lineEl = document.createElement("span");
      this.box.appendChild(this.lineEl);
    }
    var el = this.lineEl;
    while (el.firstChild) { el.removeChild(el.firstChild); }
    var run = "", runCls = null;
    var flush = function () {
      if (!run) { return; }
      if (runCls) {
        var span = document.createElement("span");
        span.className = runCls;
        span.textContent = run;
        el.appendChild(span);
      } else {
        el.appendChild(document.createTextNode(run));
      }
      run = "";
    };
    for (var i = 0; i < this.cells.length; i++) {
      var cell = this.cells[i];
      if (cell.cls !== runCls) { flush(); runCls = cell.cls; }
      run += cell.ch;
    }
    flush();
  };

  Terminal.prototype.newline = function () {
    this.draw();
    this.box.appendChild(document.createTextNode("\n"));
    this.lineEl = null;
    this.cells = [];
    this.col = 0;
    this.newlines += 1;
  };

  Terminal.prototype.write = function (chunk) {
    var text = this.pending + chunk, n = text.length, i = 0;
    this.pending = "";
    while (i < n) {
      var ch = text.charAt(i);
      if (ch === "\x1b") {
        if (i + 1 >= n) { this.pending = text.slice(i); break; }
        var kind = text.charAt(i + 1);
        if (kind === "[") {
          var j = i + 2;
          while (j < n && CSI_PARAM.test(text.charAt(j))) { j++; }
          while (j < n && CSI_INTER.test(text.charAt(j))) { j++; }
          if (j >= n) { if (n - i < MAX_ESCAPE) { this.pending = text.slice(i); } break; }
          if (CSI_FINAL.test(text.charAt(j))) { this.csi(text.slice(i + 2, j), text.charAt(j)); }
          i = j + 1;
        } else if (kind === "]") {  // an operating system command (a title): up to BEL or ESC \
          var bel = text.indexOf("\x07", i + 2), st = text.indexOf("\x1b\\", i + 2);
          var end = bel < 0 ? st : (st < 0 ? bel : Math.min(bel, st));
          if (end < 0) { if (n - i < MAX_ESCAPE) { this.pending = text.slice(i); } break; }
          i = end + (end === st ? 2 : 1);
        } else {
          i += 2;  // a two-character escape (charset, keypad mode): nothing to show
        }
        continue;
      }
      if (ch === "\n") { this.newline(); }
      else if (ch === "\r") { this.col = 0; }
      else if (ch === "\b") { this.col = Math.max(0, this.col - 1); }
      else if (ch === "\t") { do { this.put(" "); } while (this.col % 8); }
      else if (ch >= " " && ch !== "\x7f") { this.put(ch); }
      // other control characters: not shown
      i += 1;
    }
    this.open = this.cells.length > 0;
    this.draw();
  };

  // -- the page -------------------------------------------------------------------------------

  var box = document.getElementById("job-output");
  if (!box) { return; }
  var status = document.getElementById("job-output-status");
  var lines = document.getElementById("job-output-lines");
  var download = document.getElementById("job-output-download");
  var url = box.getAttribute("data-log-url");
  var interval = 2000;
  var query = "?tail=" + (box.getAttribute("data-tail") || "500");
  var attempt = null;
  var term = new Terminal(box);
  var total = null;        // lines of the whole log, when the server said (before what followed)
  var shownAtTail = 0;     // lines the first answer showed

  function say(text) { if (status) { status.textContent = text; } }
  function count(n) { return n.toLocaleString("en-US"); }
  function lineCount(text) { return (text.match(/\n/g) || []).length + (text && text.charAt(text.length - 1) !== "\n" ? 1 : 0); }

  function sayLines() {
    if (!lines) { return; }
    var shown = term.newlines + (term.open ? 1 : 0);
    if (total === null) { lines.textContent = shown ? count(shown) + (shown === 1 ? " line" : " lines") : ""; return; }
    var whole = total - shownAtTail + shown;  // the lines that came after the first answer are shown too
    lines.textContent = shown < whole
      ? "last " + count(shown) + " of " + count(whole) + " lines"
      : count(whole) + (whole === 1 ? " line" : " lines");
  }

  function step() {
    fetch(url + query, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.json().then(function (body) { return [r.ok, body]; }); })
      .then(function (pair) {
        var ok = pair[0], chunk = pair[1];
        if (!ok) { say(chunk.error || "output unavailable"); return; }
        var atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
        if (query.indexOf("?tail=") === 0) {
          total = typeof chunk.lines === "number" ? chunk.lines : null;
          shownAtTail = lineCount(chunk.data || "");
        }
        if (chunk.data) { term.write(chunk.data); }
        if (atBottom) { box.scrollTop = box.scrollHeight; }
        attempt = chunk.attempt;
        box.setAttribute("data-next-offset", String(chunk.next_offset));
        if (download && chunk.attempt) {
          download.hidden = false;
          download.setAttribute("href", download.getAttribute("data-url") + "?attempt=" + chunk.attempt +
            (chunk.node ? "&node=" + encodeURIComponent(chunk.node) : ""));
        }
        sayLines();
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
