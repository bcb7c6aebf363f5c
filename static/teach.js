/* Decoding Playground — the teaching views (templates/_teach.html): what HTML cannot do there. The tabs and the
   `view` in the URL, the token inspector's clicks, the theory charts drawn from the rounds the page receives,
   the replay player (a recorded run's messages swapped in at any speed, no engine), the race's clocks, and
   the inputs the other views' htmx requests include. Their content is HTML from /teach/... (htmx). */
(function () {
  'use strict'

  function $(id) { return document.getElementById(id) }
  function teach() { return $('teach') }
  function openName() { var t = teach(); return t ? t.dataset.open : '' }

  window.teach = { openView: function (name) { openView(name) } }

  // --- workshop mode: the server's token (in the page's address) goes with every request of the views --------------
  var token = new URLSearchParams(location.search).get('token')
  function withToken(u) { return token ? u + (u.indexOf('?') < 0 ? '?' : '&') + 'token=' + encodeURIComponent(token) : u }
  document.addEventListener('htmx:configRequest', function (evt) {
    if (token && evt.detail.path.indexOf('/teach/') === 0) evt.detail.headers.Authorization = 'Bearer ' + token
  })
  function tokenLinks() {                                // plain links (the export) cannot send a header
    var link = $('export-link')
    if (token && link && link.href.indexOf('token=') < 0) link.href = withToken(link.getAttribute('href'))
  }

  // "Download as a page" (app/views/one_file_page.py): the page saved looks as this one does now (its layout, type
  // size, theme, hidden parts and speed); the link says so when it is pressed
  document.addEventListener('click', function (ev) {
    var link = ev.target.closest && ev.target.closest('a.page-link')
    if (!link) return
    var here = new URLSearchParams(location.search)
    var q = new URLSearchParams()
    var layout = $('f-layout')
    if (layout && layout.value && layout.value.indexOf('view:') !== 0) q.set('layout', layout.value)
    if (document.body.classList.contains('presenter')) q.set('presenter', '1')
    q.set('theme', document.documentElement.dataset.theme || 'light')
    if (here.get('hide')) q.set('hide', here.get('hide'))
    var speed = $('speed') || $('replay-speed')
    if (speed) q.set('speed', speed.value)
    if (token) q.set('token', token)
    link.href = link.getAttribute('href').split('?')[0] + '?' + q.toString()
  }, true)

  // --- the recording of the run on screen (app/views/recording.py) ----------------------------------------------------
  function recordingKey() {
    var stream = $('stream')
    return (stream && stream.dataset.recording) || ''
  }
  function syncInputs() {
    tokenLinks()
    var rec = $('teach-recording')
    if (rec) rec.value = recordingKey()
  }

  // --- tabs ---------------------------------------------------------------------------------------------------
  var pollTimer = null

  function setUrlView(name) {
    var params = new URLSearchParams(location.search)
    if ((params.get('view') || '') === (name || '')) return
    if (name) params.set('view', name); else params.delete('view')
    var query = params.toString()
    history.replaceState(null, '', location.pathname + (query ? '?' + query : ''))
  }

  function openView(name) {
    var t = teach()
    if (!t) return
    t.dataset.open = name || ''
    document.querySelectorAll('[data-view-panel]').forEach(function (p) { p.hidden = p.dataset.viewPanel !== name })
    document.querySelectorAll('.teach-tab').forEach(function (tab) {
      tab.setAttribute('aria-selected', tab.dataset.viewTab === name ? 'true' : 'false')
    })
    var close = $('teach-close')
    if (close) close.hidden = !name
    setUrlView(name)
    if (pollTimer) { clearInterval(pollTimer); pollTimer = null }
    if (name) onOpen(name)
  }

  function onOpen(name) {
    var panel = $('view-' + name)
    if (!panel) return
    syncInputs()
    panel.querySelectorAll('[data-on-open]').forEach(function (el) { htmx.trigger(el, 'teach-open') })
    pollTimer = setInterval(function () {              // live figures (paging) refresh while their view is open
      var polled = panel.querySelectorAll('[data-poll]')
      if (!polled.length) return
      syncInputs()
      polled.forEach(function (el) { htmx.trigger(el, 'teach-poll') })
    }, 1000)
    if (name === 'theory') { theory.colors = null; fetchSeries() }
  }

  document.addEventListener('click', function (ev) {
    var tab = ev.target.closest && ev.target.closest('[data-view-tab]')
    if (!tab || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0) return
    ev.preventDefault()
    var name = tab.dataset.viewTab
    openView(openName() === name ? '' : name)
  })

  // --- token inspector ---------------------------------------------------------------------------------------------
  var inspector = { pinned: null, hoverTimer: null, shown: '' }

  function inspectable(el) {
    if (!el || !el.closest) return null
    var tok = el.closest('#stream .tok[data-pos], #draft-lane .chip[data-pos]')
    if (!tok) return null
    var lane = tok.closest('#draft-lane')
    var round = tok.dataset.round || (lane ? lane.dataset.round : null)
    return round ? { el: tok, round: round, pos: tok.dataset.pos, status: tok.dataset.tokenStatus,
                     node: tok.dataset.node } : null
  }

  function inspect(t) {
    var key = recordingKey()
    var target = $('inspector')
    if (!key || !target) return
    var query = 'recording=' + encodeURIComponent(key) + '&round=' + t.round + '&position=' + t.pos +
      '&status=' + encodeURIComponent(t.status) + (t.node ? '&node=' + encodeURIComponent(t.node) : '')
    if (query === inspector.shown) return
    inspector.shown = query
    htmx.ajax('GET', '/teach/inspect?' + query, { target: '#inspector', swap: 'innerHTML' })
  }

  function pin(t) {
    if (inspector.pinned) inspector.pinned.classList.remove('inspected')
    inspector.pinned = t ? t.el : null
    if (t) t.el.classList.add('inspected')
  }

  document.addEventListener('click', function (ev) {
    var t = inspectable(ev.target)
    if (!t || !$('view-inspector')) return
    if (inspector.pinned === t.el) { pin(null); return }
    pin(t)
    if (openName() !== 'inspector' && $('tab-inspector')) openView('inspector')
    inspect(t)
  })

  document.addEventListener('mouseover', function (ev) {
    if (openName() !== 'inspector' || inspector.pinned) return
    var t = inspectable(ev.target)
    if (!t) return
    clearTimeout(inspector.hoverTimer)
    inspector.hoverTimer = setTimeout(function () { inspect(t) }, 120)
  })

  // --- theory: every round the page receives (the latency chart's feed), against the formulas --------------------
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

  // --- replay: a recorded run's messages, swapped in at any speed (app/views/replay.py), no engine ----------------------
  var socket = null
  document.addEventListener('htmx:wsOpen', function (evt) { socket = evt.detail.socketWrapper })
  document.addEventListener('htmx:wsAfterMessage', function (evt) { socket = evt.detail.socketWrapper; syncInputs() })

  var replay = { frames: [], index: 0, playing: false, timer: null, name: '', model: '', key: '', rounds: 0 }

  function replayStatus(state, text) {
    var el = $('replay-status')
    if (el) { el.dataset.state = state; el.textContent = text }
    var playground = $('playground')
    if (playground) playground.classList.toggle('replaying', state === 'playing')
    var toggle = $('replay-toggle')
    if (toggle) toggle.classList.toggle('playing', state === 'playing')
    ;['replay-toggle', 'replay-step', 'replay-restart'].forEach(function (id) { if ($(id)) $(id).disabled = !replay.frames.length })
    var bar = $('replay-progress')
    if (bar) { bar.max = Math.max(1, replay.frames.length); bar.value = replay.index }
  }

  function describe() {
    var status = $('run-status')
    var round = replay.index && status ? status.dataset.round : '0'
    return (replay.name ? '“' + replay.name + '”' : 'recording') + (replay.model ? ' (' + replay.model + ')' : '') +
      ': round ' + round + ' of ' + replay.rounds
  }

  function applyFrame() {
    if (replay.index >= replay.frames.length) return false
    htmx.swap(document.body, replay.frames[replay.index], { swapStyle: 'none', swapDelay: 0, settleDelay: 0 })
    replay.index++
    document.dispatchEvent(new CustomEvent('playground:swapped'))
    return true
  }

  function speed() {
    var s = $('replay-speed')
    return !s || s.value === 'max' ? null : parseFloat(s.value)
  }

  function tick() {
    replay.timer = null
    if (!replay.playing) return
    var perSecond = speed()
    if (perSecond === null) {                       // full speed: as many frames as fit in a few ms, per frame
      var t0 = performance.now()
      while (replay.index < replay.frames.length && performance.now() - t0 < 10) applyFrame()
    } else applyFrame()
    if (replay.index >= replay.frames.length) {
      replay.playing = false
      syncInputs()
      replayStatus('done', describe() + ' — replay done')
      return
    }
    replayStatus('playing', describe())
    if (perSecond === null) replay.timer = requestAnimationFrame(tick)
    else replay.timer = setTimeout(tick, 1000 / perSecond)
  }

  function stopLive(then) {
    // the server ends its run and forgets what it drew (html_view "replay" action); start once it has answered
    if (!socket) { then(); return }
    var done = false
    function go() { if (!done) { done = true; document.removeEventListener('htmx:wsAfterMessage', go); then() } }
    document.addEventListener('htmx:wsAfterMessage', go)
    setTimeout(go, 1500)
    socket.send(JSON.stringify({ action: 'replay' }))
  }

  function play() {
    if (!replay.frames.length) return
    if (replay.index >= replay.frames.length) replay.index = 0
    replay.playing = true
    replayStatus('playing', describe())
    if (replay.index === 0) stopLive(tick); else tick()
  }

  function pause() {
    replay.playing = false
    if (replay.timer) { clearTimeout(replay.timer); cancelAnimationFrame(replay.timer); replay.timer = null }
    if (replay.frames.length) replayStatus(replay.index >= replay.frames.length ? 'done' : 'paused', describe())
  }

  function step() {
    pause()
    if (replay.index >= replay.frames.length) replay.index = 0
    var first = replay.index === 0
    var apply = function () { applyFrame(); replayStatus(replay.index >= replay.frames.length ? 'done' : 'paused', describe()) }
    if (first) stopLive(apply); else apply()
  }

  function load(file) {
    pause()
    replayStatus('loading', 'Reading ' + file.name + '…')
    file.text().then(function (text) {
      return fetch(withToken('/teach/replays'), { method: 'POST', body: text,
        headers: { 'Content-Type': 'application/json', 'X-File-Name': encodeURIComponent(file.name) } })
    }).then(function (r) { return r.json() }).then(function (data) {
      if (data.error) { replay.frames = []; replayStatus('error', data.error); return }
      replay.frames = data.frames; replay.index = 0; replay.key = data.key
      var saved = $('replay-page-link')                  // the loaded recording, as one page too
      if (saved) { saved.setAttribute('href', '/teach/recordings/' + encodeURIComponent(data.key) + '.html'); saved.hidden = false }
      replay.name = file.name; replay.model = data.model || ''; replay.rounds = data.rounds
      replayStatus('ready', describe())
      play()
    }).catch(function (e) { replay.frames = []; replayStatus('error', 'Cannot replay this file: ' + e) })
  }

  document.addEventListener('change', function (ev) {
    if (ev.target && ev.target.id === 'replay-file' && ev.target.files.length) load(ev.target.files[0])
    if (ev.target && ev.target.id === 'replay-speed' && replay.playing) {
      if (replay.timer) { clearTimeout(replay.timer); cancelAnimationFrame(replay.timer) }
      tick()
    }
  })
  document.addEventListener('click', function (ev) {
    var id = ev.target.closest && ev.target.closest('button') && ev.target.closest('button').id
    if (id === 'replay-toggle') { if (replay.playing) pause(); else play() }
    else if (id === 'replay-step') step()
    else if (id === 'replay-restart') { pause(); replay.index = 0; play() }
    else if (replay.playing && (id === 'btn-toggle' || id === 'btn-step' || id === 'btn-stop' || id === 'btn-reset')) pause()
  }, true)

  // --- race: both runs on their engine clocks ----------------------------------------------------------------------
  function startRace(race) {
    var finish = parseFloat(race.dataset.finishMs) || 1
    var choice = $('race-slowdown') ? $('race-slowdown').value : 'auto'
    var slow = choice === 'auto' ? Math.max(1, 8000 / finish) : parseFloat(choice)   // wall ms per engine ms
    var lanes = Array.prototype.map.call(race.querySelectorAll('.race-lane'), function (lane) {
      return { el: lane, total: parseFloat(lane.dataset.totalMs) || 0, next: 0, done: false,
        toks: lane.querySelectorAll('.race-stream .tok'), clock: lane.querySelector('[data-clock]'),
        count: lane.querySelector('[data-count]'), fill: lane.querySelector('[data-fill]') }
    })
    race.dataset.state = 'running'
    race.dataset.slowdown = slow.toFixed(1)
    var t0 = performance.now()
    function frame() {
      if (!race.isConnected) return
      var clock = (performance.now() - t0) / slow
      var running = false
      lanes.forEach(function (l) {
        var shown = Math.min(clock, l.total)
        var before = l.next
        while (l.next < l.toks.length && parseFloat(l.toks[l.next].dataset.t) <= clock) l.toks[l.next++].classList.add('shown')
        if (l.next > before) followLane(l)
        l.clock.textContent = shown.toFixed(1) + ' ms'
        l.count.textContent = l.next
        l.fill.setAttribute('width', (shown / finish * 1000).toFixed(1))
        if (clock >= l.total && !l.done) {
          l.done = true
          while (l.next < l.toks.length) l.toks[l.next++].classList.add('shown')
          l.count.textContent = l.next
          followLane(l)
          l.el.classList.add('finished')
          l.el.querySelectorAll('[data-final]').forEach(function (el) { el.hidden = false })
        }
        if (!l.done) running = true
      })
      if (running) requestAnimationFrame(frame)
      else { race.dataset.state = 'done'; var v = race.querySelector('[data-verdict]'); if (v) v.hidden = false }
    }
    requestAnimationFrame(frame)
  }

  // each lane's stream keeps its newest shown token in view (the box scrolls; the page does not)
  function followLane(l) {
    var box = l.el.querySelector('.race-stream')
    var last = l.toks[l.next - 1]
    if (box && last) box.scrollTop = Math.max(0, last.offsetTop + last.offsetHeight - box.clientHeight)
  }

  // The option of a race side for `setting` with `value`, selected (false when that setting has no such value:
  // two settings may share a value, "2" KV heads and γ = 2).
  function selectRaceValue(select, setting, value) {
    var o = Array.prototype.find.call(select.options, function (o) {
      return o.dataset.setting === setting && o.value === value
    })
    if (o) o.selected = true
    return !!o
  }

  // The race's setting picks which values its two sides offer (`wanted`: the pair to keep where offered, as
  // URL parameters); the pair goes into the page's URL.
  function raceChoices(changed, wanted) {
    var setting = $('race-setting')
    if (!setting) return
    var option = setting.selectedOptions[0]
    ;[['race-a', option.dataset.a, 'race_a'], ['race-b', option.dataset.b, 'race_b']].forEach(function (side) {
      var select = $(side[0]), current = select.selectedOptions[0]
      var currentFits = current && current.dataset.setting === setting.value
      var keep = wanted ? wanted.get(side[2]) : !changed && currentFits ? current.value : null
      Array.prototype.forEach.call(select.options, function (o) {
        var mine = o.dataset.setting === setting.value
        o.hidden = !mine
        o.disabled = !mine
      })
      if (keep === null || !selectRaceValue(select, setting.value, keep)) {
        selectRaceValue(select, setting.value, side[1])
      }
    })
    var params = new URLSearchParams(location.search)
    params.set('race', setting.value); params.set('race_a', $('race-a').value); params.set('race_b', $('race-b').value)
    history.replaceState(null, '', location.pathname + '?' + params.toString())
  }
  document.addEventListener('change', function (ev) {
    var id = ev.target && ev.target.id
    if (id === 'race-setting' || id === 'race-a' || id === 'race-b') raceChoices(id === 'race-setting')
  })

  // Another model re-renders the race's selects with what it can do (app/views/html.py, on its default race):
  // the page's race (in its URL, once chosen) stays where the new model offers it.
  var racePick = null          // the race's selects as the page was served (set once the document is read)
  document.addEventListener('htmx:wsAfterMessage', function () {
    var pick = $('race-pick')
    if (!pick || pick === racePick) return
    racePick = pick
    var params = new URLSearchParams(location.search), setting = $('race-setting')
    if (!params.get('race')) return
    var offered = Array.prototype.some.call(setting.options, function (o) { return o.value === params.get('race') })
    if (offered) setting.value = params.get('race')
    raceChoices(!offered, offered ? params : null)
  })

  document.addEventListener('htmx:afterSwap', function (evt) {
    var target = evt.detail && evt.detail.target
    if (target && target.id === 'race-result') {
      var race = target.querySelector('.race')
      if (race) startRace(race)
    }
  })

  // --- setup ---------------------------------------------------------------------------------------------------------
  document.addEventListener('DOMContentLoaded', function () {
    watchChartFeed()
    syncInputs()
    racePick = $('race-pick')
    var t = teach()
    window.addEventListener('resize', function () { if (openName() === 'theory') scheduleTheory() })
    document.addEventListener('change', function (ev) {
      if (ev.target && (ev.target.id === 'f-theme' || ev.target.id === 'f-presenter')) {
        theory.colors = null
        if (openName() === 'theory') scheduleTheory()
      }
    })
    if (t && t.dataset.open) setTimeout(function () { onOpen(t.dataset.open) }, 0)
    // a slide of one race (layout=view:race&autoplay=1) starts it; static/playground.js then leaves play alone
    var playground = $('playground')
    if (document.body.dataset.layout === 'view:race' && playground && playground.dataset.autoplay === '1') {
      var start = $('race-start')
      if (start) setTimeout(function () { start.click() }, 0)
    }
  })
})()
