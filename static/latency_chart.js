/* Decoding Playground — the latency chart: engine milliseconds per round, the draft's and the target's parts of
   each bar and the time per token as a line. The server's messages append the rounds to #chart-feed;
   static/playground.js drains the feed once per frame (window.latencyChart.drain) and asks for a redraw when
   the size or the theme changes (window.latencyChart.redraw), and draws the empty chart at load (draw). */
(function () {
  'use strict'

  function $(id) { return document.getElementById(id) }

  var chart = { reset: null, points: [], pending: false, drawnAt: 0, size: null, colors: null }

  function drainChart() {
    var feed = $('chart-feed')
    if (!feed) return
    var dirty = false
    if (feed.dataset.reset !== chart.reset) { chart.reset = feed.dataset.reset; chart.points = []; dirty = true }
    if (feed.firstElementChild) {
      // each message's rounds packed in one attribute: "round:target_ms:draft_ms:emitted:drafted:accepted,..."
      var items = feed.querySelectorAll('i[data-points]')
      for (var i = 0; i < items.length; i++) {
        var packed = items[i].dataset.points.split(',')
        for (var j = 0; j < packed.length; j++) {
          var f = packed[j].split(':')
          chart.points.push({ round: +f[0], target: +f[1], draft: +f[2], emitted: +f[3] })
        }
      }
      feed.replaceChildren()
      if (chart.points.length > window.playgroundLimits.chartPoints) chart.points.splice(0, chart.points.length - window.playgroundLimits.chartPoints)
      dirty = true
    }
    if (dirty && !chart.pending) {                     // at most ~8 redraws a second: it is a chart
      chart.pending = true
      setTimeout(function () { requestAnimationFrame(drawChart) }, Math.max(0, chart.drawnAt + 120 - performance.now()))
    }
  }

  function measureChart(canvas) {
    var width = Math.round(canvas.clientWidth)
    var height = Math.round(width * 0.45)
    // a slide's chart fills the height its layout leaves it (the box's height does not depend on the canvas)
    if (document.body.dataset.layout && canvas.parentElement.clientHeight > 40) height = canvas.parentElement.clientHeight
    var css = getComputedStyle(document.documentElement)
    // its type follows the page's (a slide's is larger)
    var font = Math.round(parseFloat(css.fontSize) * (document.body.dataset.layout ? 0.85 : 0.69))
    chart.size = { width: width, height: height, font: font }
    chart.colors = {}
    ;['--muted', '--chart-grid', '--chart-draft', '--chart-target', '--chart-line'].forEach(function (name) {
      chart.colors[name] = css.getPropertyValue(name).trim()
    })
  }

  function redrawChart() {
    chart.size = null
    if (!chart.pending) { chart.pending = true; requestAnimationFrame(drawChart) }
  }

  function niceMax(v) {
    if (!(v > 0)) return 1
    var p = Math.pow(10, Math.floor(Math.log10(v)))
    var steps = [1, 2, 2.5, 5, 10]
    for (var i = 0; i < steps.length; i++) if (steps[i] * p >= v) return steps[i] * p
    return 10 * p
  }

  function drawChart() {
    chart.pending = false
    chart.drawnAt = performance.now()
    var canvas = $('latency-chart')
    if (!canvas) return
    // size and colours are read only when they change (reading layout or styles here would force a
    // synchronous layout on every frame while streaming)
    if (!chart.size || !chart.colors) measureChart(canvas)
    if (!chart.size.width) return          // hidden
    var dpr = window.devicePixelRatio || 1
    var W = chart.size.width, H = chart.size.height
    if (canvas.width !== Math.round(W * dpr) || canvas.height !== Math.round(H * dpr)) {
      canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr); canvas.style.height = H + 'px'
    }
    var ctx = canvas.getContext('2d')
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0)
    var colors = chart.colors
    var color = function (name) { return colors[name] }
    ctx.clearRect(0, 0, W, H)
    var font = chart.size.font
    var left = Math.round(font * 3.6), right = 6, top = 8, bottom = Math.round(font * 1.6)
    var pts = chart.points
    // the scale follows the typical round (95th percentile): one slow outlier (a busy machine) would
    // otherwise flatten every other bar; taller bars are clipped and marked
    var totals = pts.map(function (p) { return p.target + p.draft }).sort(function (a, b) { return a - b })
    var typical = totals.length ? totals[Math.min(totals.length - 1, Math.floor(totals.length * 0.95))] : 0
    var max = niceMax(typical * 1.25)
    var plotH = H - top - bottom, plotW = W - left - right
    ctx.font = font + 'px system-ui, sans-serif'
    ctx.fillStyle = color('--muted')
    ctx.strokeStyle = color('--chart-grid')
    ctx.lineWidth = 1
    for (var g = 0; g <= 4; g++) {
      var y = top + plotH - plotH * g / 4
      ctx.beginPath(); ctx.moveTo(left, y + 0.5); ctx.lineTo(W - right, y + 0.5); ctx.stroke()
      var label = max * g / 4
      ctx.fillText((label >= 10 ? label.toFixed(0) : label.toPrecision(2)) + (g === 4 ? ' ms' : ''), 2, y + font * 0.35)
    }
    if (!pts.length) {
      ctx.fillText('Rounds appear here as they run.', left + 8, top + plotH / 2)
      return
    }
    var n = Math.max(pts.length, 40)
    var step = plotW / n
    var barW = Math.max(1, step * 0.78)
    var scale = plotH / max
    pts.forEach(function (p, i) {
      var x = left + i * step
      var hd = Math.min(p.draft * scale, plotH), ht = Math.min(p.target * scale, plotH - hd)
      ctx.fillStyle = color('--chart-draft')
      ctx.fillRect(x, top + plotH - hd, barW, hd)
      ctx.fillStyle = color('--chart-target')
      ctx.fillRect(x, top + plotH - hd - ht, barW, ht)
      if ((p.target + p.draft) > max) {            // clipped: a mark above the bar
        ctx.fillStyle = color('--chart-line')
        ctx.fillRect(x, top - 4, barW, 3)
      }
    })
    ctx.strokeStyle = color('--chart-line')
    ctx.lineWidth = 2
    ctx.beginPath()
    pts.forEach(function (p, i) {
      var perToken = (p.target + p.draft) / Math.max(1, p.emitted)
      var x = left + i * step + barW / 2, y = top + plotH - Math.min(perToken, max) * scale
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y)
    })
    ctx.stroke()
    ctx.fillStyle = color('--muted')
    ctx.fillText('round ' + pts[0].round, left, H - 6)
    var lastLabel = 'round ' + pts[pts.length - 1].round
    ctx.fillText(lastLabel, W - right - ctx.measureText(lastLabel).width, H - 6)
  }

  window.latencyChart = { draw: drawChart, drain: drainChart, redraw: redrawChart }
})()
