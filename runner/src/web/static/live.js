// The live log of a running check: appends the lines the server streams (Server-Sent Events) to
// the log as text, never as markup, and says when the run ended. The page needs nothing else.
"use strict";
(function () {
  var log = document.getElementById("log");
  if (!log || !log.dataset.live) {
    return;
  }
  var state = document.getElementById("live-state");
  var source = new EventSource(log.dataset.live);
  source.addEventListener("lines", function (event) {
    log.appendChild(document.createTextNode(JSON.parse(event.data)));
  });
  source.addEventListener("end", function (event) {
    source.close();
    log.dataset.ended = JSON.parse(event.data);
    if (state) {
      state.textContent = "The run ended: " + JSON.parse(event.data) + ". Reload the page for its steps and outputs.";
    }
  });
})();
