// Argus web UI: the incident list reloads its table every data-refresh seconds while the tab is visible.
// No library: fetch the same URL, take #live from the answer, swap it in. A session that ended sends the
// fetch to the login page, so the whole page is reloaded to show it.
(function () {
  "use strict";
  var main = document.querySelector("main[data-refresh]");
  var seconds = main ? parseInt(main.getAttribute("data-refresh"), 10) : 0;
  if (!seconds || seconds < 5) { return; }
  var stamp = document.getElementById("refreshed");

  function refresh() {
    if (document.hidden) { return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.redirected && response.url.indexOf("/ui/login") !== -1) {
          window.location.reload();
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        var live = document.getElementById("live");
        if (fresh && live) {
          live.replaceWith(fresh);
          if (stamp) { stamp.textContent = "updated " + new Date().toLocaleTimeString(); }
        }
      })
      .catch(function () {
        if (stamp) { stamp.textContent = "could not refresh; retrying"; }
      });
  }

  window.setInterval(refresh, seconds * 1000);
})();
