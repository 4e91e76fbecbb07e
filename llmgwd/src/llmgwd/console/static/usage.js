/* llmgw console, usage page: draws the figures of #usage-table (the page's own table, so the
   charts show exactly what it lists) as uPlot bar charts, one per .chart[data-col]. Static, as
   the Content-Security-Policy allows no inline script; without it the table stands alone. */
(function () {
  "use strict";

  var HEIGHT = 220;
  var COLOURS = { total_tokens: "#0b5cad", requests: "#1a7f37", spend: "#9a6700" };

  function figures(table) {
    var labels = [];
    var cols = {};
    table.querySelectorAll("tbody tr").forEach(function (tr) {
      var th = tr.querySelector("th");
      labels.push(th ? th.getAttribute("data-label") || th.textContent.trim() : "");
      tr.querySelectorAll("td[data-col]").forEach(function (td) {
        var col = td.getAttribute("data-col");
        (cols[col] = cols[col] || []).push(Number(td.getAttribute("data-value")));
      });
    });
    var head = table.querySelector("thead th");
    return { labels: labels, cols: cols, group: head ? head.textContent.trim() : "" };
  }

  function short(text) {
    return text.length > 14 ? text.slice(0, 13) + "\u2026" : text;
  }

  function options(el, col, labels, group) {
    var width = Math.max(el.clientWidth, 200);
    var n = labels.length;
    var every = Math.max(1, Math.ceil(n / Math.max(1, Math.floor(width / 70))));
    return {
      width: width,
      height: HEIGHT,
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false }, points: { show: false } },
      scales: {
        x: { time: false, range: function () { return [-0.5, n - 0.5]; } },
        y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; } },
      },
      axes: [
        {
          splits: function () { return labels.map(function (_, i) { return i; }); },
          values: function (u, splits) {
            return splits.map(function (i) { return i % every === 0 ? short(labels[i] || "") : ""; });
          },
          grid: { show: false },
        },
        { size: 70 },
      ],
      series: [
        { label: group, value: function (u, i) { return i == null ? "" : labels[i] || ""; } },
        {
          label: col === "spend" ? "Spend" : col === "requests" ? "Requests" : "Tokens",
          stroke: COLOURS[col],
          fill: COLOURS[col] + "cc",
          width: 1,
          points: { show: false },
          paths: uPlot.paths.bars({ size: [0.7, 80] }),
        },
      ],
    };
  }

  function draw() {
    var table = document.getElementById("usage-table");
    var box = document.getElementById("usage-charts");
    if (!table || !box || typeof uPlot === "undefined") {
      return;
    }
    var data = figures(table);
    var xs = data.labels.map(function (_, i) { return i; });
    box.hidden = false;
    var plots = [];
    box.querySelectorAll(".chart[data-col]").forEach(function (el) {
      var col = el.getAttribute("data-col");
      var plot = new uPlot(options(el, col, data.labels, data.group), [xs, data.cols[col] || []], el);
      plots.push({ el: el, plot: plot });
    });
    var pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(function () {
        plots.forEach(function (p) {
          p.plot.setSize({ width: Math.max(p.el.clientWidth, 200), height: HEIGHT });
        });
      }, 150);
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
