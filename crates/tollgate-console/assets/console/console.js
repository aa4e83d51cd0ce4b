// tollgate console: keeps each page's live part current from the server's
// event stream (the server renders it; this only swaps it in). Without this
// script every page still works: reload it to see the figures move.
"use strict";
(function () {
  var live = document.getElementById("live");
  if (!live || !window.EventSource) return;
  var source = new EventSource(live.getAttribute("data-events"));
  source.addEventListener("live", function (e) {
    // Never pull a control out from under the keyboard or the pointer.
    if (live.contains(document.activeElement)) return;
    var data;
    try { data = JSON.parse(e.data); } catch (err) { return; }
    live.innerHTML = data.html;
    live.setAttribute("data-updated", String(Date.now()));
  });
  source.addEventListener("error", function () {
    live.setAttribute("data-stream", "reconnecting");
  });
  source.addEventListener("open", function () {
    live.setAttribute("data-stream", "open");
  });
})();
