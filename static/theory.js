/* Decoding Playground — the Theory view's charts (templates/teach/theory.html): every round the page receives
   counted from the latency chart's feed, the server's figures for that many drawn against the formulas, and the
   measured speed-up button. static/teach.js opens the view and lends the run's recording key and workshop token. */
(function () {
  'use strict'

  function $(id) { return document.getElementById(id) }
  function openName() { var t = $('teach'); return t ? t.dataset.open : '' }
  function recordingKey() { return window.teach.recordingKey() }
  function withToken(u) { return window.teach.withToken(u) }

  // The figures are the server's (/teach/theory.json: engine/experiments/theory.py over the run's recorded rounds); this
  // counts the rounds the page has received and draws what the server computed for that many.
  var theory = { reset: null, rounds: 0, series: null, asked: -1, loading: false, pending: false, colors: null,
    askedAt: 0, deferred: null }
  // The chart asks at most this often during a run: each answer is server work beside the run, on the same
  // cores and caches, which a small model's engine time feels (docs/benchmarks.md, `bench views`)
  var THEORY_REFRESH_MS = 250

  function onRounds(reset, packed) {
    if (reset !== null && reset !== theory.reset) {
      theory.reset = reset; theory.rounds = 0; theory.series = null; theory.asked = -1
    }
    packed.forEach(function (item) {
      item.split(',').forEach(function (p) { if (p.split(':').length >= 6) theory.rounds++ })
    })
    if (openName() === 'theory') fetchSeries()
  }

  function watchChartFeed() {
    // #chart-feed is replaced for each run (data-reset) and gets one <i data-points> per message, which
    // static/playground.js empties after drawing; mutation records still hold the added nodes
    var host = $('chart-feed') && $('chart-feed').parentNode
    if (!host) return
    var feed = $('chart-feed')
    theory.reset = feed.dataset.reset
    // a message that replaces the feed and appends to it is seen twice: the new feed already holding its
    // points, and then the points added to it; each point element counts once
    var counted = new WeakSet()
    new MutationObserver(function (mutations) {
      var reset = null, packed = []
      mutations.forEach(function (m) {
        m.addedNodes.forEach(function (node) {
          if (node.nodeType !== 1) return
          if (node.id === 'chart-feed') { reset = node.dataset.reset; packed = [] }
          var items = node.matches('i[data-points]') ? [node] : node.querySelectorAll('i[data-points]')
          for (var i = 0; i < items.length; i++) {
            if (counted.has(items[i])) continue
            counted.add(items[i])
            packed.push(items[i].dataset.points)
          }
        })
      })
      if (reset !== null || packed.length) onRounds(reset, packed)
    }).observe(host, { childList: true, subtree: true })
  }

  // One request at a time; when it returns, the rounds that arrived meanwhile are asked for next. The first
  // request of a model waits for its verify-cost curve (measured once, on the server's engine thread).
  function fetchSeries() {
    var key = recordingKey()
    if (theory.loading || !key || (theory.asked === theory.rounds && theory.series)) { scheduleTheory(); return }
    var wait = theory.askedAt + THEORY_REFRESH_MS - Date.now()
    if (wait > 0) {
      if (!theory.deferred) theory.deferred = setTimeout(function () { theory.deferred = null; fetchSeries() }, wait)
      return
    }
    var rounds = theory.rounds, reset = theory.reset
    theory.loading = true
    theory.askedAt = Date.now()
    fetch(withToken('/teach/theory.json?recording=' + encodeURIComponent(key) + '&rounds=' + rounds))
      .then(function (r) { return r.ok ? r.json() : null })
      .then(function (data) {
        theory.loading = false
        if (reset !== theory.reset) { fetchSeries(); return }       // a new run began meanwhile
        if (data && data.summary) {
          theory.series = data
          theory.asked = data.measured_curve ? rounds : -1                    // without the curve yet: ask again
        }
        scheduleTheory()
        if (openName() === 'theory' && (theory.rounds !== rounds || !(data && data.measured_curve))) {
          setTimeout(fetchSeries, data && data.measured_curve ? 0 : 500)
        }
      })
      .catch(function () { theory.loading = false })
  }

  function scheduleTheory() {
    if (theory.pending) return
    theory.pending = true
    setTimeout(function () { requestAnimationFrame(drawTheory) }, 120)
  }

  function readColors() {
    var css = getComputedStyle(document.documentElement)
    var c = {}
    ;['--muted', '--chart-grid', '--fg', '--bg', '--theory-measured', '--theory-formula', '--theory-curve'].forEach(function (n) {
      c[n] = css.getPropertyValue(n).trim()
    })
    return c
  }

  function setupCanvas(canvas) {
    var W = Math.round(canvas.clientWidth), H = Math.round(W * 0.5)
    if (!W) return null
    var dpr = window.devicePixelRatio || 1
    if (canvas.width !== Math.round(W * dpr) || canvas.height !== Math.round(H * dpr)) {
      canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr); canvas.style.height = H + 'px'
    }
    var ctx = canvas.getContext('2d')
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0)
    ctx.clearRect(0, 0, W, H)
    ctx.font = '11px system-ui, sans-serif'
    return { ctx: ctx, W: W, H: H, left: 34, right: 8, top: 8, bottom: 18 }
  }

  function niceMax(v) {                       // a maximum whose quarters are round numbers
    if (!(v > 0)) return 1
    var p = Math.pow(10, Math.floor(Math.log10(v)))
    var steps = [1, 1.2, 1.6, 2, 3, 4, 6, 8, 10]
    for (var i = 0; i < steps.length; i++) if (steps[i] * p >= v) return steps[i] * p
    return 10 * p
  }

  function axes(g, max, colors, label) {
    var ctx = g.ctx, plotH = g.H - g.top - g.bottom
    ctx.strokeStyle = colors['--chart-grid']; ctx.fillStyle = colors['--muted']; ctx.lineWidth = 1
    for (var i = 0; i <= 4; i++) {
      var y = g.top + plotH - plotH * i / 4
      ctx.beginPath(); ctx.moveTo(g.left, y + 0.5); ctx.lineTo(g.W - g.right, y + 0.5); ctx.stroke()
      var v = max * i / 4
      ctx.fillText(String(+v.toFixed(2)) + (i === 4 ? label : ''), 2, y + 4)
    }
  }

  function line(g, values, max, color, dash) {
    var ctx = g.ctx, plotW = g.W - g.left - g.right, plotH = g.H - g.top - g.bottom
    var n = Math.max(values.length, 2), started = false
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.setLineDash(dash || [])
    ctx.beginPath()
    values.forEach(function (v, i) {
      if (v === null || v === undefined) return
      var x = g.left + plotW * i / (n - 1), y = g.top + plotH - Math.min(v, max) / max * plotH
      if (!started) { ctx.moveTo(x, y); started = true } else ctx.lineTo(x, y)
    })
    ctx.stroke(); ctx.setLineDash([])
  }

  function emptyText(g, colors, text) {
    g.ctx.fillStyle = colors['--muted']
    g.ctx.fillText(text, g.left + 8, g.top + (g.H - g.top - g.bottom) / 2)
  }

  function fmt(v, digits) { return v === null || v === undefined || !isFinite(v) ? '–' : v.toFixed(digits) }
  function ago(seconds) {
    return seconds < 90 ? Math.round(seconds) + ' s' : seconds < 5400 ? Math.round(seconds / 60) + ' min'
      : Math.round(seconds / 3600) + ' h'
  }

  function drawTheory() {
    theory.pending = false
    if (openName() !== 'theory') return
    var colors = theory.colors = theory.colors || readColors()
    var s = theory.series || { tokens: [], e: [], flat: [], curve: [], estimated: [], positions: [], summary: {
      rounds: 0, alpha: null, acceptance_rate: null, gamma: null, c: null, t1_ms: null, verify_ratio: null,
      e: null, flat: null, curve: null, estimated: null, tokens: null } }
    var sum = s.summary
    var speculative = sum.alpha !== null
    // tokens per target call
    var g = setupCanvas($('theory-tokens'))
    if (g) {
      var maxT = niceMax(Math.max.apply(null, s.tokens.concat(s.e.filter(function (v) { return v !== null })).concat([1])) * 1.1)
      axes(g, maxT, colors, '')
      if (!speculative) emptyText(g, colors, s.tokens.length ? 'plain decoding: 1 token per call' : 'rounds appear here as they run')
      line(g, s.e, maxT, colors['--theory-formula'], [6, 4])
      line(g, s.tokens, maxT, colors['--theory-measured'])
    }
    g = setupCanvas($('theory-speedup'))
    if (g) {
      var all = s.estimated.concat(s.flat, s.curve).filter(function (v) { return v !== null })
      var maxS = niceMax(Math.max.apply(null, all.concat([1.2])) * 1.1)
      axes(g, maxS, colors, '×')
      var plotH = g.H - g.top - g.bottom, y1 = g.top + plotH - plotH / maxS
      g.ctx.strokeStyle = colors['--muted']; g.ctx.setLineDash([2, 3]); g.ctx.beginPath()
      g.ctx.moveTo(g.left, y1); g.ctx.lineTo(g.W - g.right, y1); g.ctx.stroke(); g.ctx.setLineDash([])
      if (!speculative) emptyText(g, colors, 'needs a speculative run')
      else if (!s.measured_curve) emptyText(g, colors, 'the verify cost is measured once the engine is idle…')
      line(g, s.flat, maxS, colors['--theory-formula'], [6, 4])
      line(g, s.curve, maxS, colors['--theory-curve'], [2, 3])
      line(g, s.estimated, maxS, colors['--theory-measured'])
    }
    g = setupCanvas($('theory-positions'))
    if (g) {
      axes(g, 1, colors, '')
      var pos = s.positions, k = pos.length
      if (k < 1) emptyText(g, colors, 'needs a speculative run')
      var plotW = g.W - g.left - g.right, ph = g.H - g.top - g.bottom, step = plotW / Math.max(k, 1)
      for (var i = 1; i <= k; i++) {
        var rate = pos[i - 1].rate || 0, x = g.left + (i - 1) * step
        g.ctx.fillStyle = colors['--theory-measured']
        g.ctx.fillRect(x + step * 0.15, g.top + ph - rate * ph, step * 0.7, rate * ph)
        if (pos[i - 1].formula !== null) {
          var ya = g.top + ph - pos[i - 1].formula * ph
          g.ctx.fillStyle = colors['--theory-formula']
          g.ctx.fillRect(x + step * 0.08, ya - 1.5, step * 0.84, 3)
        }
        g.ctx.fillStyle = colors['--muted']
        if (k <= 8 || i % 2 === 1) g.ctx.fillText(String(i), x + step / 2 - 3, g.H - 5)
      }
    }
    var figures = $('theory-figures')
    if (figures) {
      figures.dataset.rounds = sum.rounds
      var values = {
        alpha: fmt(sum.alpha, 3), acceptance_rate: fmt(sum.acceptance_rate, 3), gamma: fmt(sum.gamma, 2),
        c: fmt(sum.c, 3), verify_ratio: fmt(sum.verify_ratio, 2), t1: sum.t1_ms ? sum.t1_ms.toFixed(3) + ' ms' : '–'
      }
      figures.querySelectorAll('[data-figure]').forEach(function (dd) { dd.textContent = values[dd.dataset.figure] })
    }
    var row = $('theory-run-row')
    if (row) {
      var cols = { alpha: fmt(sum.alpha, 2), c: fmt(sum.c, 2), gamma: fmt(sum.gamma, 1), e: fmt(sum.e, 2),
        flat: sum.flat ? fmt(sum.flat, 2) + '×' : '–', curve: sum.curve ? fmt(sum.curve, 2) + '×' : '–',
        estimated: sum.estimated ? fmt(sum.estimated, 2) + '×' : '–' }
      row.querySelectorAll('[data-col]').forEach(function (td) { td.textContent = cols[td.dataset.col] })
      var estimatedCell = row.querySelector('[data-col=estimated]')
      if (estimatedCell) estimatedCell.classList.toggle('slower', sum.estimated !== null && sum.estimated < 1)
    }
    var note = $('theory-note')
    if (note) {
      note.textContent = !sum.rounds ? 'Run a generation with a draft model or n-gram lookup (or replay one): each round adds a point.'
        : !speculative ? 'This run proposes nothing (method none, or no n-gram found): choose a draft model or n-gram lookup.'
          : sum.rounds + ' rounds. Measured tokens per call: ' + fmt(sum.tokens, 2) +
            '; E with the measured α: ' + fmt(sum.e, 2) + ' (predicted). Estimated speed-up: tokens per call × t(1) ÷ the median ' +
            'round’s forward time, t(1) from the verify curve' + (s.model ? ' (' + s.model + ')' : '') +
            ', c measured in this run. “Measure against plain decoding” runs this run’s settings and plain decoding ' +
            'interleaved, several times each, as the Race and the Shoot-out do.'
    }
    drawSuffix(colors, s.suffix || null)
    var treeLine = $('theory-tree'), tree = s.tree   // a token tree's tokens per forward beside a chain's E
    if (treeLine) {
      treeLine.hidden = !tree
      var tv = tree ? { tree_mal: fmt(tree.mean_acceptance_length, 2), chain_e: fmt(tree.chain_e, 2), tree_alpha: fmt(tree.alpha, 2),
        tree_depth: fmt(tree.depth, 1), tree_gain: tree.gain ? fmt(tree.gain, 2) + '×' : '–' } : {}
      treeLine.querySelectorAll('[data-figure]').forEach(function (el) { el.textContent = tv[el.dataset.figure] || '–' })
    }
    var curveNote = $('theory-curve-note')
    if (curveNote) {
      var cn = s.curve_note
      curveNote.classList.toggle('flagged', !!(cn && !cn.physical))
      curveNote.textContent = !cn ? (sum.rounds ? 'Verify curve: measured once the engine is idle (never during a run).' : '')
        : 'Verify curve' + (s.model ? ' of ' + s.model : '') + ': median of ' + cn.repeats + ' forwards per size (±' +
          Math.round(100 * cn.noise) + '%), measured ' + ago(cn.age_s) + ' ago, load average ' + cn.load_average[0] +
          ' on ' + cn.cores + ' cores.' + (cn.physical ? '' : ' NOT PHYSICAL: t(' + cn.violations.join('), t(') +
          ') below t(1) beyond the noise (a busy machine); the predictions that need it are not shown, and it is ' +
          'measured again when asked for a minute after.')
    }
  }

  // suffix decoding's rounds by their match length (x): the mean draft and accepted lengths, and the bound the rule
  // sets at that match length (/teach/theory.json's `suffix`, engine/experiments/theory.py's suffix_series)
  function drawSuffix(colors, sx) {
    var fig = $('theory-suffix-figure'), note = $('theory-suffix-note')
    if (!fig) return
    fig.hidden = !sx
    fig.dataset.rounds = sx ? sx.drafted.length : 0
    if (note) note.textContent = !sx ? '' : sx.drafted.length + ' rounds; match length → mean drafted (bound): ' +
      sx.by_match.map(function (b) { return b.match_len + ' → ' + fmt(b.drafted, 1) + ' (' + b.bound + ')' }).join(', ')
    var g = sx && setupCanvas($('theory-suffix'))
    if (!g) return
    var by = sx.by_match, maxM = by[by.length - 1].match_len
    var maxY = niceMax(Math.max.apply(null, by.map(function (b) { return Math.max(b.bound, b.drafted) }).concat([1])) * 1.1)
    axes(g, maxY, colors, '')
    var plotW = g.W - g.left - g.right, ph = g.H - g.top - g.bottom, step = plotW / maxM
    by.forEach(function (b) {
      var x = g.left + (b.match_len - 1) * step
      g.ctx.fillStyle = colors['--theory-measured']
      g.ctx.fillRect(x + step * 0.15, g.top + ph - b.drafted / maxY * ph, step * 0.4, b.drafted / maxY * ph)
      g.ctx.fillStyle = colors['--theory-curve']
      g.ctx.fillRect(x + step * 0.55, g.top + ph - b.accepted / maxY * ph, step * 0.3, b.accepted / maxY * ph)
      g.ctx.fillStyle = colors['--theory-formula']
      g.ctx.fillRect(x + step * 0.08, g.top + ph - b.bound / maxY * ph - 1.5, step * 0.84, 3)
      g.ctx.fillStyle = colors['--muted']
      if (maxM <= 12 || b.match_len % 4 === 1) g.ctx.fillText(String(b.match_len), x + step / 2 - 3, g.H - 5)
    })
  }

  // The measured speed-up: plain decoding of this run's prompt and settings, timed on the same engine (server side)
  document.addEventListener('click', function (evt) {
    if (!evt.target.closest || !evt.target.closest('#theory-measure')) return
    var out = $('theory-measured'), note = $('theory-measured-note'), key = recordingKey()
    if (!key) { note.textContent = 'run a generation first'; return }
    out.textContent = '…'
    delete out.dataset.verdict
    note.textContent = 'running this run’s settings and plain decoding, interleaved, several times each…'
    fetch(withToken('/teach/plain.json?recording=' + encodeURIComponent(key)))
      .then(function (r) { return r.json() })
      .then(function (d) {
        if (d.error) { out.textContent = '–'; note.textContent = d.error; out.dataset.verdict = 'error'; return }
        out.textContent = d.median.toFixed(2) + '×'
        ;['median', 'low', 'high', 'verdict', 'page_ms_per_token'].forEach(function (k) { out.dataset[k] = d[k] })
        out.classList.toggle('slower', d.verdict === 'slower')
        out.classList.toggle('faster', d.verdict === 'faster')
        note.textContent = d.text + '; plain decoding ' + d.plain_ms_per_token.toFixed(2) + ' ms per token, this run’s ' +
          'settings ' + d.run_ms_per_token.toFixed(2) + ' ms (medians of ' + d.repeats + ' runs each, interleaved; load average ' +
          d.load_average[0] + ' on ' + d.cores + ' cores)' + (d.same_text ? '; identical text' : '') +
          '. This run on the page: ' + d.page_ms_per_token.toFixed(2) + ' ms per token of engine time.'
      })
      .catch(function () { out.textContent = '–'; out.dataset.verdict = 'error' })
  })

  window.theory = { opened: function () { theory.colors = null; fetchSeries() } }

  document.addEventListener('DOMContentLoaded', function () {
    watchChartFeed()
    window.addEventListener('resize', function () { if (openName() === 'theory') scheduleTheory() })
    document.addEventListener('change', function (ev) {
      if (ev.target && (ev.target.id === 'f-theme' || ev.target.id === 'f-presenter')) {
        theory.colors = null
        if (openName() === 'theory') scheduleTheory()
      }
    })
  })
})()
