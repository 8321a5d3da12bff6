(function () {
  "use strict";
  function key(row, i, numeric) {
    var cell = row.cells[i];
    var raw = cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent;
    return numeric ? (raw === "" ? NaN : parseFloat(raw)) : raw.toLowerCase();
  }
  function sortTable(table, i, dir) {
    var head = table.tHead.rows[0].cells;
    var numeric = head[i].getAttribute("data-type") === "num";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a, i, numeric), y = key(b, i, numeric);
      if (numeric) {
        if (isNaN(x) || isNaN(y)) { return isNaN(x) - isNaN(y); }
        return dir === "asc" ? x - y : y - x;
      }
      return dir === "asc" ? x.localeCompare(y) : y.localeCompare(x);
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(head, function (c) { c.removeAttribute("aria-sort"); });
    head[i].setAttribute("aria-sort", dir === "asc" ? "ascending" : "descending");
  }
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
      th.tabIndex = 0;
      function go() {
        var now = th.getAttribute("aria-sort");
        var dir = now ? (now === "ascending" ? "desc" : "asc") : (th.getAttribute("data-first") || "desc");
        sortTable(table, i, dir);
      }
      th.addEventListener("click", go);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") { go(); } });
    });
    table.setAttribute("data-sortable-ready", "1");
  });
  var params = new URLSearchParams(window.location.search);
  var wanted = params.get("sort");
  if (wanted) {
    Array.prototype.forEach.call(tables, function (table) {
      var head = Array.prototype.slice.call(table.tHead.rows[0].cells);
      var i = head.findIndex(function (c) { return c.getAttribute("data-key") === wanted; });
      if (i >= 0) { sortTable(table, i, params.get("dir") === "asc" ? "asc" : "desc"); }
    });
  }
  document.documentElement.setAttribute("data-ready", "1");
})();
