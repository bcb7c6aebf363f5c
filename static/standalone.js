/* Decoding Playground — the player of a run saved as one page (app/views/one_file_page.py). The page holds the run's
   frames, the messages the live page received; this swaps them in, at the chosen speed, as htmx swapped them live
   (each top-level element by its id, or appended to its target), with no server. Space plays and pauses, → shows
   one round, R starts over, + and − change the speed, End goes back to the newest token; static/playground.js does
   the rest (the chart, the stream following its newest token, "latest ↓", the layouts). The file's own address
   overrides how it looks: ?layout=stream&presenter=1&theme=dark&speed=2&autoplay=1. */
(function () {
  'use strict'

  function $(id) { return document.getElementById(id) }

  // what a start over puts back: every element the frames replace or append to, as the page was saved
  var TARGETS = ['run-status', 'error', 'summary', 'stream', 'model-info', 'draft-lane', 'kv-target-caption',
    'kv-target-grid', 'kv-draft-caption', 'kv-draft-grid', 'gauge-grid', 'server-gauges', 'chart-feed', 'notes']
  var player = { frames: [], index: 0, playing: false, timer: null, initial: {} }

  function swap(html) {
    var tpl = document.createElement('template')
    tpl.innerHTML = html
    Array.prototype.slice.call(tpl.content.children).forEach(function (el) {
      var how = el.getAttribute('hx-swap-oob') || 'true'
      el.removeAttribute('hx-swap-oob')
      if (how.indexOf('beforeend:') === 0) {
        var target = document.querySelector(how.slice('beforeend:'.length))
        if (target) target.append.apply(target, Array.prototype.slice.call(el.childNodes))
      } else {
        var old = el.id && $(el.id)
        if (old) old.replaceWith(el)          // an element this page does not have (the export link) is left out
      }
    })
  }

  function applyFrame() {
    if (player.index >= player.frames.length) return false
    swap(player.frames[player.index++])
    document.dispatchEvent(new CustomEvent('playground:swapped'))
    return true
  }

  function perSecond() {
    var v = $('speed').value
    return v === 'max' ? null : parseFloat(v)
  }

  function show() {
    var done = player.index >= player.frames.length
    var playground = $('playground')
    playground.classList.toggle('player-playing', player.playing)
    $('btn-toggle').textContent = player.playing ? '❚❚ Pause' : done ? '▶ Play again' : '▶ Play'
    var bar = $('player-progress')
    bar.max = Math.max(1, player.frames.length)
    bar.value = player.index
    var status = $('run-status')
    var round = player.index && status ? status.dataset.round : '0'
    $('player-position').textContent = (player.playing ? 'playing' : done ? 'the end' : player.index ? 'paused' : 'ready') +
      ' · round ' + round + ' · frame ' + player.index + ' of ' + player.frames.length
    playground.dataset.player = player.playing ? 'playing' : done ? 'done' : player.index ? 'paused' : 'ready'
  }

  function stopTimer() {
    if (player.timer !== null) { clearTimeout(player.timer); cancelAnimationFrame(player.timer); player.timer = null }
  }

  function tick() {
    player.timer = null
    if (!player.playing) return
    var rate = perSecond()
    if (rate === null) {                       // full speed: as many frames as fit in 10 ms, then the next frame
      var t0 = performance.now()
      while (performance.now() - t0 < 10 && applyFrame()) { /* next */ }
    } else {
      applyFrame()
    }
    if (player.index >= player.frames.length) player.playing = false
    show()
    if (player.playing) player.timer = rate === null ? requestAnimationFrame(tick) : setTimeout(tick, 1000 / rate)
  }

  function restart() {
    stopTimer()
    player.playing = false
    player.index = 0
    TARGETS.forEach(function (id) {
      var el = $(id)
      if (el && player.initial[id]) el.replaceWith(player.initial[id].cloneNode(true))
    })
    document.dispatchEvent(new CustomEvent('playground:swapped'))
    show()
  }

  function play() {
    if (player.index >= player.frames.length) restart()
    player.playing = true
    show()
    tick()
  }

  function pause() {
    stopTimer()
    player.playing = false
    show()
  }

  function step() {
    if (player.playing) pause()
    if (player.index >= player.frames.length) restart()
    applyFrame()
    show()
  }

  function changeSpeed(by) {
    var select = $('speed')
    var i = Math.min(select.options.length - 1, Math.max(0, select.selectedIndex + by))
    if (i === select.selectedIndex) return
    select.selectedIndex = i
    select.dispatchEvent(new Event('change', { bubbles: true }))
  }

  function decode() {
    var el = $('run-frames')
    var text = el.textContent
    if (el.dataset.encoding !== 'gzip+base64') return Promise.resolve(JSON.parse(text))
    if (typeof DecompressionStream === 'undefined') {
      return Promise.reject(new Error('this browser cannot unpack the run (it needs the Compression Streams API: ' +
        'Chrome or Edge 80, Firefox 113, Safari 16.4 or later)'))
    }
    var bytes = Uint8Array.from(atob(text), function (c) { return c.charCodeAt(0) })
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))
    return new Response(stream).text().then(JSON.parse)
  }

  function options() {                         // the file's own address, over what it was saved with
    var q = new URLSearchParams(location.search)
    if (q.get('theme') === 'light' || q.get('theme') === 'dark') document.documentElement.dataset.theme = q.get('theme')
    if (q.has('presenter')) document.body.classList.toggle('presenter', /^(1|true|yes|on)$/i.test(q.get('presenter')))
    var layout = $('f-layout')
    if (q.has('layout') && layout && Array.prototype.some.call(layout.options, function (o) { return o.value === q.get('layout') })) {
      layout.value = q.get('layout')
      layout.dispatchEvent(new Event('change', { bubbles: true }))       // static/playground.js applies it
    }
    var speed = $('speed')
    if (q.has('speed') && Array.prototype.some.call(speed.options, function (o) { return o.value === q.get('speed') })) {
      speed.value = q.get('speed')
    }
    return { autoplay: q.has('autoplay') ? /^(1|true|yes|on)$/i.test(q.get('autoplay')) : $('playground').dataset.autoplay === '1' }
  }

  document.addEventListener('keydown', function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || (ev.target && /^(INPUT|SELECT|TEXTAREA)$/.test(ev.target.tagName))) return
    if (ev.key === '+' || ev.key === '=') { ev.preventDefault(); changeSpeed(1) }
    else if (ev.key === '-' || ev.key === '−') { ev.preventDefault(); changeSpeed(-1) }
    else if (ev.key === 'End') {
      ev.preventDefault()
      var latest = $('stream-latest')
      if (latest && !latest.hidden) latest.click()
    }
  })

  document.addEventListener('DOMContentLoaded', function () {
    TARGETS.forEach(function (id) { var el = $(id); if (el) player.initial[id] = el.cloneNode(true) })
    var opts = options()
    $('btn-toggle').addEventListener('click', function () { if (player.playing) pause(); else play() })
    $('btn-step').addEventListener('click', step)
    $('btn-reset').addEventListener('click', restart)
    $('speed').addEventListener('change', function () {
      $('playground').dataset.speed = $('speed').value      // full speed: no entrance animations (app.css)
      if (player.playing) { stopTimer(); tick() }
    })
    decode().then(function (frames) {
      player.frames = frames
      ;['btn-toggle', 'btn-step', 'btn-reset'].forEach(function (id) { $(id).disabled = false })
      show()
      if (opts.autoplay) play()
    }).catch(function (e) {
      $('player-position').textContent = 'Cannot play this run: ' + e.message
      $('playground').dataset.player = 'error'
    })
  })
})()
