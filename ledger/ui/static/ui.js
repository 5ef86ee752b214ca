// steptrail ui: follow the ledger without reloading. Every 2 s (while the tab is
// visible) ask the server's api/head (its URL, under the served prefix, is the body's
// data-api) for the head; when it moved, or verify finished, fetch this page's main
// fragment and swap it in. No inline script, nothing from the network but this server.
//
// A tab only believes the server that served it: each poll and fragment request
// carries a fresh random nonce, and an answer is accepted only with an HMAC-SHA256 of
// (nonce, "\n", its exact bytes) under the key this page's body carries (data-live-key,
// drawn when the server started). A process that takes the port after the server
// stopped sees the requests, never a page body: it cannot answer. On a bad or missing
// MAC, a 403/404, or any failure, polling stops for good and the page says the server
// stopped (reload to reconnect). A swapped fragment never carries meta, base, frames,
// objects, scripts or links to stylesheets: they are removed before it is inserted.
"use strict";
(function () {
  var body = document.body;
  var busy = false;
  var stopped = false;
  var PERIOD = 2000;
  var API = body.dataset.api;
  var KEYHEX = body.dataset.liveKey || "";
  var keyPromise = null;
  var timer = null;
  var REMOVED = "meta,base,iframe,frame,frameset,object,embed,script,link,style,form";

  function setLive(text, cls) {
    var live = document.getElementById("live");
    if (live) { live.textContent = text; live.className = "live " + (cls || ""); }
  }

  function stop(why) {
    stopped = true;
    if (timer !== null) { window.clearInterval(timer); timer = null; }
    setLive("server stopped · " + why + " · reload to reconnect", "stopped");
  }

  function hexBytes(hex) {
    var out = new Uint8Array(hex.length / 2);
    for (var i = 0; i < out.length; i++) { out[i] = parseInt(hex.substr(2 * i, 2), 16); }
    return out;
  }

  function toHex(buf) {
    return Array.prototype.map.call(new Uint8Array(buf), function (b) {
      return ("0" + b.toString(16)).slice(-2);
    }).join("");
  }

  function key() {
    if (keyPromise === null) {
      keyPromise = window.crypto.subtle.importKey(
        "raw", hexBytes(KEYHEX), {name: "HMAC", hash: "SHA-256"}, false, ["sign"]);
    }
    return keyPromise;
  }

  function nonce() {
    var bytes = new Uint8Array(16);
    window.crypto.getRandomValues(bytes);
    return toHex(bytes.buffer);
  }

  // The response's bytes, if its MAC over (nonce, "\n", bytes) is ours; else reject.
  function verified(res, n) {
    if (!res.ok) { return Promise.reject(new Error("HTTP " + res.status)); }
    var mac = res.headers.get("x-steptrail-mac") || "";
    return res.arrayBuffer().then(function (buf) {
      var prefix = new TextEncoder().encode(n + "\n");
      var msg = new Uint8Array(prefix.length + buf.byteLength);
      msg.set(prefix, 0);
      msg.set(new Uint8Array(buf), prefix.length);
      return key().then(function (k) {
        return window.crypto.subtle.sign("HMAC", k, msg);
      }).then(function (sig) {
        if (toHex(sig) !== mac) { throw new Error("not this server's answer"); }
        return new TextDecoder("utf-8").decode(buf);
      });
    });
  }

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
    Array.prototype.forEach.call(fresh.querySelectorAll(REMOVED), function (el) {
      el.remove();
    });
    main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes));
    body.dataset.head = res.headers.get("x-steptrail-head") || body.dataset.head;
    body.dataset.verify = res.headers.get("x-steptrail-verify") || body.dataset.verify;
  }

  function tick() {
    if (stopped || busy || document.hidden || !API) { return; }
    busy = true;
    var n = nonce();
    fetch(API + "?nonce=" + n, {credentials: "same-origin", cache: "no-store",
                                redirect: "error"})
      .then(function (r) { return verified(r, n); })
      .then(function (text) {
        var doc = JSON.parse(text);
        setLive("head #" + doc.seq + " · live", "");
        if (!changed(doc)) { return null; }
        body.dataset.stats = doc.stats.state;
        var m = nonce();
        return fetch(window.location.href, {
          credentials: "same-origin", cache: "no-store", redirect: "error",
          headers: {"X-Steptrail-Fragment": "1", "X-Steptrail-Nonce": m}})
          .then(function (res) {
            return verified(res, m).then(function (html) { swap(html, res); });
          });
      })
      .catch(function (err) { stop(err && err.message ? err.message : "no answer"); })
      .then(function () { busy = false; });
  }

  if (!window.crypto || !window.crypto.subtle || !KEYHEX) {
    setLive("live view off (this browser has no WebCrypto here)", "stopped");
    return;
  }
  timer = window.setInterval(tick, PERIOD);
  document.addEventListener("visibilitychange", tick);
})();
