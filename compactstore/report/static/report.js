(function () {
  "use strict";
  // The numbers come from a JSON data block; text is only ever set with textContent.
  var data = JSON.parse(document.getElementById("report-data").textContent);
  function number(value) {
    return value === null ? "not recorded" : value.toLocaleString("en-US");
  }
  function dollars(value) {
    if (value === null) {
      return "no price";
    }
    return "$" + value.toFixed(Math.abs(value) < 1 ? 4 : 2);
  }
  // The row of ``rows`` (sorted by seq, its first element) nearest the pointer's seq.
  function follow(chart, cursor, x1, rows, show) {
    chart.addEventListener("mousemove", function (event) {
      var point = chart.createSVGPoint();
      point.x = event.clientX;
      point.y = event.clientY;
      var local = point.matrixTransform(chart.getScreenCTM().inverse());
      var seq = ((local.x - data.x0) / (x1 - data.x0)) * data.top_seq;
      var low = 0;
      var high = rows.length - 1;
      while (low < high) {
        var middle = (low + high) >> 1;
        if (rows[middle][0] < seq) {
          low = middle + 1;
        } else {
          high = middle;
        }
      }
      if (low > 0 && Math.abs(rows[low - 1][0] - seq) <= Math.abs(rows[low][0] - seq)) {
        low -= 1;
      }
      if (cursor) {
        var x = data.x0 + ((x1 - data.x0) * rows[low][0]) / data.top_seq;
        cursor.setAttribute("x1", x);
        cursor.setAttribute("x2", x);
        cursor.setAttribute("class", "cursor shown");
      }
      show(low, rows[low]);
    });
  }
  var usage = document.getElementById("usage-chart");
  var readout = document.getElementById("readout");
  var calls = data.calls;
  if (usage && readout && calls.length) {
    follow(usage, document.getElementById("cursor"), data.x1, calls, function (index, call) {
      readout.textContent =
        "model call " + (index + 1) + " of " + calls.length + " at seq " + number(call[0]) +
        ": the store counted " + number(call[1]) + " tokens, the provider " + number(call[2]) +
        " (window " + number(data.window) + ")";
    });
  }
  var billed = data.billed;
  var costReadout = document.getElementById("cost-readout");
  function bill(index, row) {
    costReadout.textContent =
      "billed call " + (index + 1) + " of " + billed.length + " at seq " + number(row[0]) +
      ": uncached " + number(row[1]) + ", cache read " + number(row[2]) +
      ", cache write " + number(row[3]) + ", output " + number(row[4]) + " tokens; " +
      dollars(row[5]) + ", " + dollars(row[6]) + " so far";
  }
  var costChart = document.getElementById("cost-chart");
  var cacheChart = document.getElementById("cache-chart");
  if (costReadout && billed.length) {
    if (costChart) {
      follow(costChart, null, data.cost_x1, billed, bill);
    }
    if (cacheChart) {
      follow(cacheChart, null, data.x1, billed, bill);
    }
  }
})();
