/* Decoding Playground — the teaching views (templates/_teach.html): what HTML cannot do there. The tabs and the
   `view` in the URL, the token inspector's clicks, the replay player (a recorded run's messages swapped in at any
   speed, no engine), the race's clocks, and the inputs the other views' htmx requests include. Their content is
   HTML from /teach/... (htmx); the Theory view's charts are static/theory.js's. */
(function () {
  'use strict'

  function $(id) { return document.getElementById(id) }
  function teach() { return $('teach') }
  function openName() { var t = teach(); return t ? t.dataset.open : '' }

  // what the other scripts ask of this one (static/playground.js's layouts, static/theory.js)
  window.teach = { openView: function (name) { openView(name) }, recordingKey: function () { return recordingKey() },
    withToken: function (u) { return withToken(u) } }

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
    if (name === 'theory' && window.theory) window.theory.opened()
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
    syncInputs()
    racePick = $('race-pick')
    var t = teach()
    if (t && t.dataset.open) setTimeout(function () { onOpen(t.dataset.open) }, 0)
    // a slide of one race (layout=view:race&autoplay=1) starts it; static/playground.js then leaves play alone
    var playground = $('playground')
    if (document.body.dataset.layout === 'view:race' && playground && playground.dataset.autoplay === '1') {
      var start = $('race-start')
      if (start) setTimeout(function () { start.click() }, 0)
    }
  })
})()
