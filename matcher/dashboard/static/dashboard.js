// The dashboard's only script: pages marked data-refresh reload themselves while visible.
(function () {
  "use strict";
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!seconds) { return; }
  var timer = null;
  function arm() {
    if (timer) { clearTimeout(timer); }
    timer = setTimeout(function () {
      if (document.visibilityState === "visible" && !document.querySelector("input:focus, select:focus")) {
        window.location.reload();
      } else { arm(); }
    }, seconds * 1000);
  }
  document.addEventListener("visibilitychange", arm);
  arm();
}());
