// The page's one script, for what changes while runs go. Everything it shows is drawn by the
// server (and escaped there) or added as text, never as markup.
//
// - The live log of a running check: adds the lines the server streams (Server-Sent Events,
//   drawn there: numbers, stderr, colours as classes, text as text) to the log, a new section
//   for each step that starts; follows them while the reader is at the bottom of the page and
//   stops when they scroll up; puts the steps the stream sends in the steps table and the
//   sections' summaries as they start and end; when the run ends, puts the finished check's
//   page in place of this one's, so its status, duration, steps and log are true without a
//   reload.
// - A list of checks with one still queued or running: every few seconds the page fetches
//   itself and puts the new list in place of the old, until every check listed has ended; the
//   reader's scroll stays where it is.
"use strict";
(function () {
  var page = document.scrollingElement || document.documentElement;
  var atBottom = function () {
    return page.scrollHeight - page.scrollTop - page.clientHeight <= 24;
  };

  // Fetches this page again and puts its `main` in place of this one's; gives the new `main`.
  var renew = function () {
    return fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error(String(response.status));
        }
        return response.text();
      })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html").querySelector("main");
        var now = document.querySelector("main");
        if (!fresh || !now) {
          throw new Error("no page");
        }
        now.replaceWith(document.adoptNode(fresh));
        return fresh;
      });
  };

  // An element with a class and a text.
  var element = function (tag, className, text) {
    var made = document.createElement(tag);
    if (className) {
      made.className = className;
    }
    if (text !== undefined) {
      made.textContent = text;
    }
    return made;
  };

  // A line as the stream draws it: `{n, c, s: [[classes, text]], step?: [name, index]}`.
  var drawLine = function (item) {
    var row = element("div", item.c);
    row.id = "L" + item.n;
    var number = element("a", "ln", String(item.n));
    number.href = "#L" + item.n;
    row.appendChild(number);
    if (item.c === "line err") {
      var mark = element("span", "mark", "!");
      mark.title = "stderr";
      row.appendChild(mark);
    }
    var text = element("span", "tx");
    item.s.forEach(function (run) {
      text.appendChild(run[0] ? element("span", run[0], run[1]) : document.createTextNode(run[1]));
    });
    row.appendChild(text);
    return row;
  };

  // A step's status and time in a section's summary.
  var summarize = function (section, status, className, time) {
    var summary = section.querySelector("summary");
    summary.querySelectorAll(".status, .meta").forEach(function (old) {
      old.remove();
    });
    summary.appendChild(element("span", "status " + className, status));
    if (time) {
      summary.appendChild(document.createTextNode(" "));
      summary.appendChild(element("span", "meta", time));
    }
  };

  var log = document.getElementById("log");
  if (log && log.dataset.live) {
    var state = document.getElementById("live-state");
    var source = new EventSource(log.dataset.live);
    // The section new lines go to: the last one, or one made for the lines before a step.
    var current = function () {
      var sections = log.querySelectorAll(":scope > details.section");
      if (sections.length) {
        return sections[sections.length - 1];
      }
      var setUp = element("details", "section");
      setUp.appendChild(element("summary", "", "Set up"));
      log.appendChild(setUp);
      return setUp;
    };
    source.addEventListener("lines", function (event) {
      var follow = atBottom();
      JSON.parse(event.data).forEach(function (item) {
        if (item.step) {
          var section = element("details", "section step");
          section.open = true;
          section.dataset.step = String(item.step[1]);
          var summary = element("summary");
          summary.appendChild(element("span", "step", item.step[0]));
          summary.appendChild(document.createTextNode(" "));
          section.appendChild(summary);
          summarize(section, "running", "live");
          log.appendChild(section);
        }
        current().appendChild(drawLine(item));
      });
      if (follow) {
        page.scrollTop = page.scrollHeight;
      }
    });
    source.addEventListener("steps", function (event) {
      var rows = JSON.parse(event.data);
      var body = document.getElementById("steps");
      if (!body) {
        return;
      }
      var none = document.getElementById("no-steps");
      if (none && rows.length) {
        none.remove();
      }
      var fresh = document.createElement("tbody");
      fresh.id = "steps";
      rows.forEach(function (row, index) {
        var tr = element("tr");
        tr.appendChild(element("td", "step", row.name));
        var status = element("td");
        status.appendChild(element("span", "status " + row.class, row.status));
        if (row.reason) {
          status.appendChild(document.createTextNode(" "));
          status.appendChild(element("span", "reason", "(" + row.reason + ")"));
        }
        tr.appendChild(status);
        tr.appendChild(element("td", "", row.exit));
        tr.appendChild(element("td", "", row.time));
        fresh.appendChild(tr);
        var section = log.querySelector(':scope > details.step[data-step="' + index + '"]');
        if (section) {
          summarize(section, row.status, row.class, row.time);
        }
      });
      body.replaceWith(fresh);
    });
    source.addEventListener("end", function (event) {
      source.close();
      var status = JSON.parse(event.data);
      log.dataset.ended = status;
      if (state) {
        state.textContent = "The run ended: " + status + ".";
      }
      var follow = atBottom();
      renew()
        .then(function () {
          document.body.dataset.ended = status;
          if (follow) {
            page.scrollTop = page.scrollHeight;
          }
        })
        .catch(function () {
          if (state) {
            state.textContent = "The run ended: " + status + ". Reload the page for its steps and outputs.";
          }
        });
    });
  }

  var list = document.querySelector("main[data-refresh]");
  if (list) {
    var every = (Number(list.dataset.refresh) || 3) * 1000;
    var refresh = function () {
      renew()
        .then(function (fresh) {
          if (fresh.hasAttribute("data-refresh")) {
            window.setTimeout(refresh, every);
          }
        })
        .catch(function () {
          window.setTimeout(refresh, every);
        });
    };
    window.setTimeout(refresh, every);
  }
})();
