// steptrail ui: follow the ledger without reloading. Every 2 s (while the tab is
// visible) ask the server's api/head (its URL, under the served prefix, is the body's
// data-api) for the head; when it moved, or verify finished, fetch this
// page's main fragment and swap it in. No inline script, nothing from the network
// but this server; the fragment is the server's escaped HTML.
"use strict";
(function () {
  var body = document.body;
  var busy = false;
  var PERIOD = 2000;
  var API = body.dataset.api;

  function changed(doc) {
    return String(doc.seq) !== body.dataset.head ||
      doc.verify.state !== body.dataset.verify ||
      doc.stats.state !== body.dataset.stats;
  }

  function swap(html, res) {
    var parsed = new DOMParser().parseFromString(
      "<main id=\"content\">" + html + "</main>", "text/html");
    var fresh = parsed.getElementById("content");
    var main = document.getElementById("content");
    if (!fresh || !main) { return; }
    main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes));
    body.dataset.head = res.headers.get("x-steptrail-head") || body.dataset.head;
    body.dataset.verify = res.headers.get("x-steptrail-verify") || body.dataset.verify;
  }

  function tick() {
    if (busy || document.hidden || !API) { return; }
    busy = true;
    fetch(API, {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (doc) {
        if (!doc) { return null; }
        var live = document.getElementById("live");
        if (live) { live.textContent = "head #" + doc.seq + " · live"; }
        if (!changed(doc)) { return null; }
        body.dataset.stats = doc.stats.state;
        return fetch(window.location.href, {credentials: "same-origin", cache: "no-store",
                                            headers: {"X-Steptrail-Fragment": "1"}})
          .then(function (res) {
            if (!res.ok) { return null; }
            return res.text().then(function (html) { swap(html, res); });
          });
      })
      .catch(function () {
        var live = document.getElementById("live");
        if (live) { live.textContent = "disconnected"; }
      })
      .then(function () { busy = false; });
  }

  window.setInterval(tick, PERIOD);
  document.addEventListener("visibilitychange", tick);
})();
