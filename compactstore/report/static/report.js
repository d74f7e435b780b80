(function () {
  "use strict";
  // The numbers come from a JSON data block; text is only ever set with textContent.
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var chart = document.getElementById("usage-chart");
  var cursor = document.getElementById("cursor");
  var readout = document.getElementById("readout");
  var calls = data.calls;
  if (!chart || !cursor || !readout || !calls.length) {
    return;
  }
  function number(value) {
    return value === null ? "not recorded" : value.toLocaleString("en-US");
  }
  chart.addEventListener("mousemove", function (event) {
    var point = chart.createSVGPoint();
    point.x = event.clientX;
    point.y = event.clientY;
    var local = point.matrixTransform(chart.getScreenCTM().inverse());
    var seq = ((local.x - data.x0) / (data.x1 - data.x0)) * data.top_seq;
    var low = 0;
    var high = calls.length - 1;
    while (low < high) {
      var middle = (low + high) >> 1;
      if (calls[middle][0] < seq) {
        low = middle + 1;
      } else {
        high = middle;
      }
    }
    if (low > 0 && Math.abs(calls[low - 1][0] - seq) <= Math.abs(calls[low][0] - seq)) {
      low -= 1;
    }
    var call = calls[low];
    var x = data.x0 + ((data.x1 - data.x0) * call[0]) / data.top_seq;
    cursor.setAttribute("x1", x);
    cursor.setAttribute("x2", x);
    cursor.setAttribute("class", "cursor shown");
    readout.textContent =
      "model call " + (low + 1) + " of " + calls.length + " at seq " + number(call[0]) +
      ": the store counted " + number(call[1]) + " tokens, the provider " + number(call[2]) +
      " (window " + number(data.window) + ")";
  });
})();
