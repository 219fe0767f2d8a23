// The page's one script, for what changes while runs go. Everything it shows is drawn by the
// server (and escaped there) or added as text, never as markup.
//
// - The live log of a running check: appends the lines the server streams (Server-Sent Events)
//   to the log as text; follows them while the reader is at the bottom of the page and stops
//   when they scroll up; when the run ends, puts the finished check's page in place of this
//   one's, so its status, duration, steps and log are true without a reload.
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

  var log = document.getElementById("log");
  if (log && log.dataset.live) {
    var state = document.getElementById("live-state");
    var source = new EventSource(log.dataset.live);
    source.addEventListener("lines", function (event) {
      var follow = atBottom();
      log.appendChild(document.createTextNode(JSON.parse(event.data)));
      if (follow) {
        page.scrollTop = page.scrollHeight;
      }
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
