/* Decoding Playground — the JavaScript HTML cannot do: keyboard shortcuts, presets, the URL kept in step
   with the controls, keeping the DOM bounded on long runs, the stream following its newest
   token, the layouts for slides (the KV map's cells sized to fill one), and the figures that
   `decoding-playground bench page` reads (window.playgroundStats). htmx and its websocket extension do
   everything else: the form is sent with ws-send, the server's fragments are swapped by id. */
(function () {
  'use strict'

  // What the page keeps on long runs (older tokens, notes and chart points are dropped). One chunk is one
  // message's tokens: a round when paced (<= 17 tokens), a frame at full speed.
  var limits = window.playgroundLimits = { streamChunks: 400, notes: 80, chartPoints: 160 }

  function $(id) { return document.getElementById(id) }

  // --- figures for benchmarks and tests --------------------------------------------------------------
  var stats = window.playgroundStats = {
    run: null, tokens: 0, rejected: 0, messages: 0,
    firstTokenAt: null, lastTokenAt: null, doneAt: null, longTasks: [],
    tokenTimes: []        // when new tokens appeared in the stream (ms), one entry per appearance, bounded
  }
  try {
    new PerformanceObserver(function (list) {
      list.getEntries().forEach(function (e) { stats.longTasks.push({ start: e.startTime, duration: e.duration }) })
    }).observe({ type: 'longtask', buffered: true })
  } catch (e) { /* no long-task timing in this browser */ }

  function resetStats(run) {
    stats.run = run; stats.tokens = 0; stats.rejected = 0
    stats.firstTokenAt = null; stats.lastTokenAt = null; stats.doneAt = null; stats.tokenTimes = []
  }

  function watchStream(wrap) {
    new MutationObserver(function (mutations) {
      var now = performance.now(), shown = 0
      for (var i = 0; i < mutations.length; i++) {
        var added = mutations[i].addedNodes
        for (var j = 0; j < added.length; j++) {
          var node = added[j]
          if (node.id === 'stream') { resetStats(node.dataset.run); setFollow(true); continue }
          if (!node.classList || !node.classList.contains('chunk')) continue
          var toks = node.children
          for (var k = 0; k < toks.length; k++) {
            if (!toks[k].classList.contains('tok')) continue
            if (toks[k].dataset.tokenStatus === 'rejected') { stats.rejected++; continue }
            stats.tokens++; shown++
            if (stats.firstTokenAt === null) stats.firstTokenAt = now
            stats.lastTokenAt = now
          }
        }
      }
      if (shown && stats.tokenTimes.length < 100000) stats.tokenTimes.push(now)
    }).observe(wrap, { childList: true, subtree: true })
  }

  // --- keyboard: space play / pause, right arrow one round, r reset --------------------------------------
  var SHORTCUTS = { ' ': 'btn-toggle', Spacebar: 'btn-toggle', ArrowRight: 'btn-step', r: 'btn-reset', R: 'btn-reset' }

  function typing(target) {
    if (!target || !target.tagName) return false
    if (target.isContentEditable) return true
    if (target.tagName === 'TEXTAREA' || target.tagName === 'SELECT') return true
    return target.tagName === 'INPUT' && target.type !== 'checkbox'
  }

  document.addEventListener('keydown', function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || typing(ev.target)) return
    var id = SHORTCUTS[ev.key]
    if (!id) return
    ev.preventDefault()   // also keeps a focused button from being "clicked" by the space bar
    if (ev.repeat) return
    var button = $(id)
    if (button && !button.disabled) button.click()
  })
  document.addEventListener('keyup', function (ev) {
    if (ev.key === ' ' && ev.target && ev.target.tagName === 'BUTTON') ev.preventDefault()
  })

  // --- the form: presets, view options, the URL -----------------------------------------------------------
  // A control showing an external engine's value (applyServerSet) keeps its own in data-server-set: a preset
  // writes there, the URL reads from there.
  function setValue(el, value) {
    var own = el.dataset.serverSet ? JSON.parse(el.dataset.serverSet) : el
    if (el.type === 'checkbox') own.checked = value === 'true' || value === true
    else own.value = value
    if (own !== el) el.dataset.serverSet = JSON.stringify(own)
  }

  function fieldValue(el) {
    var own = el.dataset.serverSet ? JSON.parse(el.dataset.serverSet) : el
    return el.type === 'checkbox' ? (own.checked ? 'true' : 'false') : own.value
  }

  function syncUrl() {
    var form = $('controls')
    if (!form) return
    var current = new URLSearchParams(location.search)
    var params = new URLSearchParams()
    // what a URL leaves out takes the chosen model's defaults (app/views/page.py): compare with those
    var model = form.elements.model ? form.elements.model.value : ''
    var perModel = form.dataset.modelDefaults ? JSON.parse(form.dataset.modelDefaults)[model] : null
    form.querySelectorAll('[name][data-default]').forEach(function (el) {
      var value = fieldValue(el)
      var def = el.name !== 'model' && perModel && el.name in perModel ? perModel[el.name] : el.dataset.default
      if (value !== def) params.set(el.name, value)
    })
    var theme = $('f-theme')
    if (theme && theme.value !== 'light') params.set('theme', theme.value)
    var presenter = $('f-presenter')
    if (presenter && presenter.checked) params.set('presenter', '1')
    var layout = $('f-layout')
    if (layout && layout.value) params.set('layout', layout.value)
    // not controls of this form: kept as the link (or the teaching views' script) has them
    ;['autoplay', 'hide', 'token', 'view', 'race', 'race_a', 'race_b'].forEach(function (name) {
      if (current.has(name)) params.set(name, current.get(name))
    })
    var query = params.toString()
    var url = location.pathname + (query ? '?' + query : '')
    if (url !== location.pathname + location.search) history.replaceState(null, '', url)
    var embed = $('embed-link')
    if (embed) embed.href = '/embed' + (query ? '?' + query : '')
  }

  function applyViewOptions() {
    var theme = $('f-theme')
    if (theme) document.documentElement.dataset.theme = theme.value
    var presenter = $('f-presenter')
    if (presenter) document.body.classList.toggle('presenter', presenter.checked)
    var playground = $('playground')
    var speed = $('speed')
    if (speed && playground) playground.dataset.speed = speed.value   // full speed: no entrance animations
    var hideRejected = $('f-hide-rejected')
    if (hideRejected && playground) playground.classList.toggle('hide-rejected', hideRejected.checked)
  }

  function applyPreset(select) {
    var option = select.selectedOptions[0]
    if (!option || !option.value) return
    var form = $('controls')
    form.querySelectorAll('.settings [name][data-default]').forEach(function (el) { setValue(el, el.dataset.default) })
    form.elements.prompt.value = option.dataset.prompt
    var settings = JSON.parse(option.dataset.settings)
    Object.keys(settings).forEach(function (name) {
      var el = form.querySelector('[name="' + name + '"][data-default]')
      if (el) setValue(el, String(settings[name]))
    })
    var hint = $('preset-hint')
    if (hint) hint.textContent = option.dataset.hint
    delete form.dataset.tree                          // the defaults' tree, if any, is the one to come back to
    if (form.elements.method) followMethod(form.elements.method)
  }

  // A method that drafts no token tree (the draft model, suffix decoding, plain decoding) runs a chain: choosing one
  // (or a preset with one) shows the chain's top-k and budget, so that the form sends settings it can run; choosing a tree method again
  // brings back the tree the form had.
  function followMethod(select) {
    var form = $('controls')
    var topk = form.elements.speculative_eagle_topk, budget = form.elements.speculative_num_draft_tokens
    if (!topk || !budget || !form.dataset.treeMethods) return
    var drafts = form.dataset.treeMethods.split(' ').indexOf(select.value) >= 0
    if (!drafts && topk.value !== '1') {
      form.dataset.tree = JSON.stringify([topk.value, budget.value])
      topk.value = '1'
      budget.value = ''
    } else if (drafts && form.dataset.tree && topk.value === '1') {
      var tree = JSON.parse(form.dataset.tree)
      topk.value = tree[0]
      budget.value = tree[1]
      delete form.dataset.tree
    }
  }

  // --- keeping the DOM bounded -------------------------------------------
  function trim() {
    var stream = $('stream')
    // #stream holds the prompt, one .chunk per message and, once trimmed, a marker; counting its children is
    // cheap, so the chunks are only looked up when there are too many
    if (stream && stream.childElementCount > limits.streamChunks + 2) {
      var chunks = stream.querySelectorAll(':scope > .chunk')
      for (var i = 0; i < chunks.length - limits.streamChunks; i++) chunks[i].remove()
      if (!stream.querySelector('.trimmed')) {
        var marker = document.createElement('span')
        marker.className = 'mark trimmed'
        marker.textContent = '… earlier tokens dropped from the page'
        stream.insertBefore(marker, stream.querySelector('.chunk'))
      }
    }
    var notes = $('notes')
    while (notes && notes.childElementCount > limits.notes) notes.firstElementChild.remove()
  }

  // --- the stream follows its newest token, until the reader scrolls up ---------------------------------------
  // Once per frame the box is scrolled to its end (one layout read, in the frame the browser lays out anyway);
  // a scroll up by the reader stops it and shows "latest ↓"; scrolling back to the end, or the button, resumes.
  var follow = { on: true, lastTop: 0 }

  function setFollow(on) {
    follow.on = on
    var button = $('stream-latest')
    if (button) button.hidden = on
    var wrap = $('stream-wrap')
    if (wrap) wrap.dataset.following = on ? '1' : '0'
  }

  function keepLatest() {
    var wrap = $('stream-wrap')
    if (!wrap || !follow.on) return
    var end = wrap.scrollHeight - wrap.clientHeight
    if (wrap.scrollTop < end) wrap.scrollTop = end
    follow.lastTop = wrap.scrollTop
  }

  function watchScroll(wrap) {
    wrap.addEventListener('scroll', function () {
      var atEnd = wrap.scrollHeight - wrap.clientHeight - wrap.scrollTop <= 4
      if (atEnd) { if (!follow.on) setFollow(true) }
      else if (wrap.scrollTop < follow.lastTop - 1 && follow.on) setFollow(false)
      follow.lastTop = wrap.scrollTop
    }, { passive: true })
  }

  // --- layouts for slides: the body's data-layout (static/slides.css), chosen by the URL or #f-layout -------------------
  function applyLayout(value) {
    if (value) document.body.dataset.layout = value
    else delete document.body.dataset.layout
    if (value.indexOf('view:') === 0 && window.teach && window.teach.openView) window.teach.openView(value.slice(5))
    fitKv(true)
    window.latencyChart.redraw()
    keepLatest()
  }

  // In the kv layout the map's cells grow to fill the panel: the largest size at which every block still fits.
  // Measured when a pool is drawn whole (a new grid element) or the frame changes, not per message.
  function fitKv(force) {
    var big = document.body.dataset.layout === 'kv'
    document.querySelectorAll('.kv-pool').forEach(function (pool) {
      var grid = pool.querySelector('.kv-grid')
      if (!grid || (!force && pool.sizedGrid === grid)) return
      pool.sizedGrid = grid
      var n = grid.getElementsByClassName('kv').length
      if (!big || !n) { pool.style.removeProperty('--kv-cell'); return }
      var gap = 2, w = grid.clientWidth, h = grid.clientHeight, size = 48
      while (size > 6 && Math.floor((w + gap) / (size + gap)) * Math.floor((h + gap) / (size + gap)) < n) size--
      pool.style.setProperty('--kv-cell', size + 'px')
    })
  }

  // Once per frame, not per message: the chart, the bounded DOM, the stream kept at its newest token.
  // After the frame that shows them, the page tells the server how many messages it has rendered: at full
  // speed the server sends the next one only then, coalescing what the engine wrote meanwhile, so the page
  // is never behind and does less work per token the busier the machine is.
  var frameScheduled = false
  var socket = null
  var acked = 0
  function afterMessages() {
    frameScheduled = false
    window.latencyChart.drain()
    trim()
    keepLatest()
    if (document.body.dataset.layout === 'kv') fitKv(false)
    applyServerSet()
    if (socket && stats.messages > acked) {
      acked = stats.messages
      socket.send(JSON.stringify({ ack: acked }))
    }
  }

  document.addEventListener('htmx:wsOpen', function () { stats.messages = 0; acked = 0 })

  // Controls an external engine sets at start-up: the server names them in #server-set (app/views/page.py),
  // with the values it is known to run with (data-values). They stay disabled, its reason as their title, each
  // showing the server's value or "set by the server" (never our form's), until one of our models is picked
  // again: then each gets back its own value, state and title.
  var SET_BY_SERVER = 'set by the server'
  var serverSetShown = ''
  function showServerValue(el, value) {
    el.dataset.serverSet = JSON.stringify({ title: el.title, disabled: el.disabled, value: el.value,
      checked: el.checked, placeholder: el.placeholder || '' })
    el.disabled = true
    if (el.tagName === 'SELECT') {
      var option = document.createElement('option')
      option.value = el.value
      option.text = value === undefined ? SET_BY_SERVER : value
      option.dataset.serverValue = ''
      el.insertBefore(option, el.firstChild)
      el.selectedIndex = 0
    } else if (el.type === 'checkbox') {
      if (value === undefined) el.indeterminate = true
      else el.checked = !!value
    } else {
      el.value = value === undefined ? '' : value
      el.placeholder = value === undefined ? SET_BY_SERVER : ''
    }
  }
  function restoreOwnValue(el) {
    var own = JSON.parse(el.dataset.serverSet)
    delete el.dataset.serverSet
    el.querySelectorAll('option[data-server-value]').forEach(function (o) { o.remove() })
    el.title = own.title
    el.disabled = own.disabled
    if (el.type === 'checkbox') { el.indeterminate = false; el.checked = own.checked }
    else el.value = own.value
    if (el.tagName !== 'SELECT' && el.type !== 'checkbox') el.placeholder = own.placeholder
  }
  function applyServerSet() {
    var note = $('server-set')
    if (!note) return
    var key = (note.dataset.controls || '') + (note.dataset.values || '') + note.textContent
    if (key === serverSetShown) return
    serverSetShown = key
    document.querySelectorAll('[data-server-set]').forEach(restoreOwnValue)
    var values = JSON.parse(note.dataset.values || '{}')
    ;(note.dataset.controls || '').split(' ').filter(Boolean).forEach(function (id) {
      var el = $(id)
      if (!el) return
      showServerValue(el, values[id])
      el.title = note.textContent
    })
  }

  // A replay (static/teach.js) swaps in recorded messages without the websocket: the same per-frame work
  // (chart, bounded DOM), and nothing acknowledged to the server.
  document.addEventListener('playground:swapped', function () {
    if (!frameScheduled) { frameScheduled = true; requestAnimationFrame(afterMessages) }
  })

  document.addEventListener('htmx:wsAfterMessage', function (evt) {
    socket = evt.detail.socketWrapper
    stats.messages++
    if (stats.doneAt === null) {
      var status = $('run-status')
      if (status && status.dataset.state === 'done') stats.doneAt = performance.now()
    }
    if (!frameScheduled) { frameScheduled = true; requestAnimationFrame(afterMessages) }
  })

  // --- autoplay: press play once the websocket is open and the page has loaded --------------------------------------
  // The websocket often opens while the document is still being parsed and laid out: a run started then
  // competes with the page's own loading for the CPU (on a 2-core machine, ~100 ms of it), so play waits for
  // the load event and the frame after it.
  var autoplayed = false
  function autoplay() {
    var playground = $('playground')
    if (autoplayed || !playground || playground.dataset.autoplay !== '1') return
    autoplayed = true
    if (document.body.dataset.layout === 'view:race') return    // the race starts itself (static/teach.js)
    $('btn-toggle').click()
  }
  document.addEventListener('htmx:wsOpen', function () {
    if (document.readyState === 'complete') { autoplay(); return }
    window.addEventListener('load', function () {
      requestAnimationFrame(function () { setTimeout(autoplay, 0) })
    }, { once: true })
  })

  // --- servers the app starts (vLLM) offered while they start: their options say so until /api/models says ready
  function followStartingServers() {
    var select = $('f-model')
    var starting = select && Array.prototype.filter.call(select.options, function (o) { return / \((starting…|failed[^)]*)\)$/.test(o.text) })
    if (!starting || !starting.length) return
    var token = new URLSearchParams(location.search).get('token')
    fetch('/api/models', token ? { headers: { Authorization: 'Bearer ' + token } } : {})
      .then(function (r) { return r.json() })
      .then(function (body) {
        var pending = false
        body.models.forEach(function (m) {
          if (m.state === undefined) return
          var option = starting.find(function (o) { return o.value === m.name })
          if (!option) return
          option.text = m.name + (m.ready ? '' : m.state === 'starting' ? ' (starting…)' : ' (' + m.state + ')')
          if (m.state === 'starting') pending = true
        })
        if (pending) setTimeout(followStartingServers, 3000)
      })
      .catch(function () { setTimeout(followStartingServers, 10000) })
  }

  document.addEventListener('DOMContentLoaded', function () {
    var form = $('controls')
    applyServerSet()
    followStartingServers()
    var wrap = $('stream-wrap')
    if (wrap) { watchStream(wrap); watchScroll(wrap) }
    window.addEventListener('resize', function () { window.latencyChart.redraw(); fitKv(true); keepLatest() })
    var layout = $('f-layout')
    if (layout) layout.addEventListener('change', function () { applyLayout(layout.value); syncUrl() })
    document.addEventListener('click', function (ev) {
      var el = ev.target.closest && ev.target.closest('#stream-latest, .tpl-toggle, [data-press]')
      if (!el) return
      if (el.id === 'stream-latest') { setFollow(true); keepLatest() }
      else if (el.dataset.press) { var button = $(el.dataset.press); if (button && !button.disabled) button.click() }
      else {                                   // a chat template's runs open and close together
        var stream = $('stream')
        var open = stream.classList.toggle('tpl-open')
        stream.querySelectorAll('.tpl-toggle').forEach(function (t) { t.setAttribute('aria-expanded', open ? 'true' : 'false') })
        // the reader is looking at the template: the box stays there, and says where the newest token went
        var wrap = $('stream-wrap')
        if (wrap.scrollHeight - wrap.clientHeight - wrap.scrollTop > 4) setFollow(false)
      }
    })
    if (form) {
      form.addEventListener('change', function (ev) {
        if (ev.target && ev.target.id === 'f-method') followMethod(ev.target)
        if (ev.target && ev.target.id === 'preset') {
          applyPreset(ev.target)
          // the preset's change event is already on its way to the form's ws-send: it carries the new values
        }
        applyViewOptions()
        if (ev.target && (ev.target.id === 'f-theme' || ev.target.id === 'f-presenter')) window.latencyChart.redraw()
        syncUrl()
      }, true)   // capture: runs before htmx's listener reads the form
      form.addEventListener('input', syncUrl)
    }
    applyViewOptions()
    window.latencyChart.draw()
  })
})()
