"""The teaching views in a real Chromium against a real uvicorn server: each view opened by its URL and filled
from a real run, and a replay of an exported run showing the same tokens and statuses as the run itself.

Waits are conditions with bounded timeouts; nothing depends on which tokens a model writes, only on what the
engine reports. Screenshots go to test-artifacts/ (teach-*.png).
"""
from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from app.presets import DEFAULT_PROMPT
from e2e.test_playground import PROMPT, open_page, url, wait_state, wait_until
from engine.experiments.theory import expected_tokens_per_round
from engine.kv.memory import paging_waste, seed_request_mix

pytestmark = pytest.mark.browser

SAMPLED = dict(method="draft_model", num_speculative_tokens=3, temperature=1, max_tokens=80, speed="max",
               prompt=PROMPT)


def stream_tokens(page) -> list[str]:
    return page.eval_on_selector_all("#stream .tok", "els => els.map(e => e.dataset.tokenStatus + ':' + e.textContent)")


def only_view(page, name: str) -> None:
    shown = page.eval_on_selector_all("[data-view-panel]", "els => els.filter(e => !e.hidden).map(e => e.dataset.viewPanel)")
    assert shown == [name]
    assert page.get_attribute(f"#tab-{name}", "aria-selected") == "true"


def test_inspector_by_url_explains_a_token_of_the_run(live_server, page, artifacts_dir):
    open_page(page, url(live_server, view="inspector", **SAMPLED))
    only_view(page, "inspector")
    page.click("#btn-toggle")
    wait_state(page, "done")
    # a resampled token: its probabilities, and the residual it was drawn from
    tok = page.locator("#stream .tok[data-token-status='resampled']").first
    title = tok.get_attribute("title")
    tok.click()
    page.wait_for_selector("#inspector .inspector-grid[data-inspected='resampled']")
    p_shown = page.inner_text("#inspector [data-figure='p']")
    assert f"p={p_shown}" in title                                  # the same p the stream's tooltip gives
    assert page.locator("#inspector .insp-residual li").count() >= 1
    assert "residual" in page.inner_text("#inspector .insp-why")
    page.screenshot(path=str(artifacts_dir / "teach-inspector.png"))
    # an accepted draft token: the draw r passed the test r < min(1, p/q)
    page.locator("#stream .tok[data-token-status='accepted']").first.click()
    page.wait_for_selector("#inspector .inspector-grid[data-inspected='accepted']")
    r = float(page.inner_text("#inspector [data-figure='r']"))
    a = float(page.inner_text("#inspector [data-figure='accept_prob']"))
    assert r < a and "accepted" in page.inner_text("#inspector .insp-verdict")
    assert page.locator("#inspector .dist-bars li.is-token").count() >= 1    # x is in the top-5 it came from
    # a chip of the draft lane is inspectable too
    chip = page.locator("#draft-lane .chip[data-pos]").first
    round_, pos, status = (page.get_attribute("#draft-lane", "data-round"), chip.get_attribute("data-pos"),
                           chip.get_attribute("data-token-status"))
    chip.click()
    page.wait_for_selector(f"#inspector .inspector-grid[data-round='{round_}'][data-pos='{pos}'][data-inspected='{status}']")
    assert page.recorder.errors == []


def test_theory_view_follows_the_run(live_server, page, artifacts_dir):
    open_page(page, url(live_server, view="theory", theme="dark", **{**SAMPLED, "max_tokens": 120}))
    only_view(page, "theory")
    rows = page.locator("#theory-table tbody tr.slower")
    assert rows.count() == 1 and "0.88" in rows.inner_text()         # the second seed's slowdown row
    page.click("#btn-toggle")
    wait_state(page, "done")
    # every round reaches the charts (drawn a moment after the last one arrives)
    wait_until(page, "document.querySelector('#theory-figures').dataset.rounds === "
                     "document.querySelector('#run-status').dataset.round")
    wait_until(page, "document.querySelector('#theory-run-row [data-col=curve]').textContent.includes('×')")
    # its acceptance rate is the gauge's, and its E is Leviathan's formula (the same one engine/experiments/theory.py has)
    # (to their precisions: the figure has 3 decimals, the gauge 2)
    assert float(page.inner_text("#theory-figures [data-figure=acceptance_rate]")) == \
        pytest.approx(float(page.inner_text("#m-acceptance_rate")), abs=0.005 + 0.0005 + 1e-9)
    # the figures are the server's (engine/experiments/theory.py over the recorded rounds): the page draws what it is sent,
    # and with γ the same in every proposing round E is Leviathan's formula at the run's α
    key = page.get_attribute("#stream", "data-recording")
    series = page.evaluate(f"fetch('/teach/theory.json?recording={key}').then(r => r.json())")
    assert float(page.inner_text("#theory-run-row [data-col=e]")) == pytest.approx(series["summary"]["e"], abs=0.005)
    assert float(page.inner_text("#theory-figures [data-figure=alpha]")) == \
        pytest.approx(series["summary"]["alpha"], abs=0.0005 + 1e-9)
    if series["summary"]["gamma"] == 3 and all(p["formula"] is not None for p in series["positions"]):
        assert series["summary"]["e"] <= expected_tokens_per_round(series["summary"]["alpha"], 3) + 1e-9
    alpha = float(page.inner_text("#theory-figures [data-figure=alpha]"))
    assert 0 < alpha < 1 and float(page.inner_text("#theory-run-row [data-col=e]")) > 1
    # the verify curve's age and load beside it; the measured speed-up by the comparison method
    assert re.search(r"measured \d+ (s|min|h) ago, load average [\d.]+ on \d+ cores", page.inner_text("#theory-curve-note"))
    page.click("#theory-measure")
    page.wait_for_selector("#theory-measured[data-verdict]", state="attached", timeout=120_000)
    assert page.get_attribute("#theory-measured", "data-verdict") in ("faster", "slower", "no clear difference here")
    assert re.search(r"over \d+ interleaved rounds.*This run on the page: [\d.]+ ms per token of engine time",
                     page.inner_text("#theory-measured-note"))
    page.screenshot(path=str(artifacts_dir / "teach-theory-dark.png"))
    assert page.recorder.errors == []


def test_distribution_check_runs_in_the_background_with_progress(live_server, page, artifacts_dir):
    open_page(page, url(live_server, view="distribution"))
    only_view(page, "distribution")
    page.select_option("#view-distribution select[name=samples]", "50000")
    page.click("#distribution-run")
    page.wait_for_selector("#distribution-job[data-state='running'] progress")
    page.wait_for_selector("#distribution-job[data-state='done']", timeout=60_000)
    acceptance = float(page.inner_text("#distribution-job [data-figure=acceptance_rate]"))
    theory = float(page.inner_text("#distribution-job [data-figure=theory]"))
    assert abs(acceptance - theory) < 0.02                            # 50,000 samples: sd about 0.002
    spec = float(page.inner_text("#distribution-job [data-figure=tvd_speculative]"))
    direct = float(page.inner_text("#distribution-job [data-figure=tvd_direct]"))
    draft = float(page.inner_text("#distribution-job [data-figure=tvd_draft_only]"))
    assert spec < draft and spec < 3 * direct + 0.01                  # as close to p as sampling noise
    assert page.locator("#distribution-job .dist-hist rect.bar-spec").count() == 8
    page.screenshot(path=str(artifacts_dir / "teach-distribution.png"))
    assert page.recorder.errors == []


def test_memory_and_paging_show_the_seeds_figures_and_the_live_pool(live_server, page, artifacts_dir):
    open_page(page, url(live_server, view="memory"))
    only_view(page, "memory")
    figure = page.locator("#memory-body [data-figure=bytes_per_token]")
    expect(figure).to_have_text("144 KiB")
    expect(page.locator("#memory-body [data-figure=kv_bytes]")).to_have_text("72 GiB")
    page.click("#memory-body .memory-presets button:has-text('Llama-3.2-1B draft')")
    expect(figure).to_have_text("128 KiB")
    expect(page.locator("#memory-body [data-figure=draft_bytes_per_token]")).to_have_text("32 KiB")
    expect(page.locator("#memory-body [data-figure=draft_kv_bytes]")).to_have_text("256 MiB")
    page.fill("#memory-body input[name=context]", "16384")
    page.dispatch_event("#memory-body input[name=context]", "change")
    expect(page.locator("#memory-body [data-figure=kv_bytes]")).to_have_text("2 GiB")
    page.screenshot(path=str(artifacts_dir / "teach-memory.png"))
    # the paging tab: the seed's mix, then this server's pools while a run holds blocks
    page.click("#tab-paging")
    only_view(page, "paging")
    assert "view=paging" in page.url
    row = page.locator("#paging-body tr[data-block-size='16']")
    expect(row).to_contain_text("0.7%")
    assert f"{paging_waste(seed_request_mix(), None) * 100:.1f}%" in page.inner_text("#paging-body tr[data-block-size='none']")
    page.select_option("#speed", "5")
    page.fill("#f-max_tokens", "400")
    page.dispatch_event("#f-max_tokens", "change")
    page.click("#btn-toggle")
    page.wait_for_selector("#paging-live .paging-run", timeout=30_000)       # this run's own blocks
    assert re.search(r"\d+ tokens in \d+ blocks of 16", page.inner_text("#paging-live .paging-run"))
    wait_until(page, "[...document.querySelectorAll('#paging-live tbody tr')].some(r => !r.classList.contains('idle'))")
    # the run's own line and its pool's row weigh preallocation against the same context (the model's)
    row = page.locator("#paging-live tr[data-pool^='target:']:not(.idle) [data-figure=context]")
    assert page.inner_text("#paging-live .paging-run [data-figure=context]") == row.inner_text()
    page.screenshot(path=str(artifacts_dir / "teach-paging.png"))
    page.click("#btn-stop")
    wait_state(page, "done")
    assert page.recorder.errors == []


def test_faults_side_by_side_with_the_divergence_marked(live_server, page, artifacts_dir):
    # the page's default prompt: there the shipped draft is rejected within the first tokens
    open_page(page, url(live_server, view="faults", method="draft_model", num_speculative_tokens=4,
                        prompt=DEFAULT_PROMPT))
    only_view(page, "faults")
    page.click("#view-faults .toggle:has-text('truncate')")
    page.wait_for_selector("#faults-result .fault-result[data-fault='no_truncate']", timeout=30_000)
    d = int(page.get_attribute("#faults-result .fault-result", "data-divergence"))
    lanes = [page.eval_on_selector_all(f"#faults-result [data-lane={lane}] .tok", "els => els.map(e => e.textContent)")
             for lane in ("reference", "faulty")]
    assert lanes[0][:d] == lanes[1][:d] and lanes[0][d:d + 1] != lanes[1][d:d + 1]
    assert page.locator("#faults-result .tok.diverge").count() == 2    # marked on both sides
    assert "truncate" in page.inner_text("#faults-result .fault-why")
    page.screenshot(path=str(artifacts_dir / "teach-faults.png"))
    page.click("#view-faults .toggle:has-text('residual')")
    page.wait_for_selector("#faults-result .fault-result[data-fault='unnormalized_residual']", timeout=30_000)
    assert "Probabilities do not sum to 1" in page.inner_text("#faults-result .fault-error")
    assert page.recorder.errors == []


def test_cost_model_here_beside_a_projection(live_server, page, artifacts_dir):
    open_page(page, url(live_server, view="cost"))
    only_view(page, "cost")
    page.wait_for_selector("#cost-body .cost-card.there", timeout=60_000)
    assert "projection" in page.inner_text("#cost-body .cost-card.there").lower()
    alone = float(page.inner_text("#cost-body [data-figure=speedup_there]").rstrip("×"))
    assert 1.5 < alone < 3.5
    page.select_option("#cost-body select[name=batch]", "256")
    page.wait_for_selector("#cost-body select[name=batch] option[value='256'][selected]", state="attached")
    busy = float(page.inner_text("#cost-body [data-figure=speedup_there]").rstrip("×"))
    assert float(page.inner_text("#cost-body [data-figure=verify_ratio_there]")) > 1 and busy < alone
    page.screenshot(path=str(artifacts_dir / "teach-cost.png"))
    assert page.recorder.errors == []


def test_race_plain_against_speculative_with_their_clocks(live_server, page, artifacts_dir):
    open_page(page, url(live_server, view="race", method="draft_model", num_speculative_tokens=3, temperature=0,
                        max_tokens=60, prompt=PROMPT))
    only_view(page, "race")
    page.select_option("#race-slowdown", "10")
    page.click("#race-start")
    answer = page.wait_for_selector("#race-result .race, #race-result .teach-error", timeout=120_000)
    assert "teach-error" not in (answer.get_attribute("class") or ""), answer.inner_text()
    page.wait_for_selector("#race-result .race[data-state='done']", timeout=60_000)
    for lane in ("a", "b"):                                           # plain, then the draft model
        sel = f"#race-result .race-lane[data-lane={lane}]"
        total = float(page.get_attribute(sel, "data-total-ms"))
        clock = page.inner_text(f"{sel} [data-clock]")                   # its own engine clock, to 0.1 ms:
        assert clock.endswith(" ms") and abs(float(clock[:-3]) - total) <= 0.05 + 1e-9   # JS rounds 29.25 up
        assert page.locator(f"{sel} .tok.shown").count() == page.locator(f"{sel} .tok").count() == 60
    texts = [page.inner_text(f"#race-result .race-lane[data-lane={lane}] .race-stream") for lane in ("a", "b")]
    assert texts[0] == texts[1]                                       # greedy: the same text both ways
    assert page.is_visible("#race-result [data-verdict]")
    page.screenshot(path=str(artifacts_dir / "teach-race.png"))
    assert page.recorder.errors == []


def test_a_replay_of_an_exported_run_shows_the_same_tokens_and_statuses(live_server, page, artifacts_dir, tmp_path):
    open_page(page, url(live_server, view="replay", **SAMPLED))
    only_view(page, "replay")
    page.click("#btn-toggle")
    wait_state(page, "done")
    original = stream_tokens(page)
    summary = page.inner_text("#summary")
    assert {t.split(":")[0] for t in original} >= {"target", "accepted", "rejected"}
    page.wait_for_selector("#run-recording[data-complete='1'] #export-link")
    with page.expect_download() as download:
        page.click("#export-link")
    path = tmp_path / "run.json"
    download.value.save_as(path)
    recording = json.loads(path.read_text())
    assert recording["settings"]["temperature"] == 1 and recording["events"][0]["type"] == "started"

    replays = []
    for attempt in range(2):                                          # the same file, twice, in fresh pages
        open_page(page, url(live_server, view="replay"))
        page.select_option("#replay-speed", "max" if attempt else "25")
        page.set_input_files("#replay-file", str(path))
        page.wait_for_selector("#replay-status[data-state='done']", timeout=60_000)
        replays.append(stream_tokens(page))
        assert page.inner_text("#summary") == summary                 # the run's own figures, not re-measured
        assert page.get_attribute("#run-status", "data-state") == "done"
    assert replays[0] == original and replays[1] == original
    page.screenshot(path=str(artifacts_dir / "teach-replay.png"))
    # the inspector works on the replayed run
    page.locator("#stream .tok[data-token-status='rejected']").first.click()
    page.wait_for_selector("#inspector .inspector-grid[data-inspected='rejected']")
    assert page.recorder.errors == []


def test_the_race_offers_what_the_chosen_model_can_run(live_server, page):
    # plain against the EAGLE head on target-mha, whose heads are trained; then a model with no heads
    open_page(page, url(live_server, view="race", model="target-mha", race="method", race_a="none", race_b="eagle"))
    assert page.input_value("#race-b") == "eagle"
    page.select_option("#f-model", "target-gqa")
    wait_until(page, "!document.querySelector('#race-b option[value=eagle]')")
    assert (page.input_value("#race-a"), page.input_value("#race-b")) == ("none", "draft_model")
    assert "race_b=draft_model" in page.url
    # a race of KV heads keeps its pair where the new model offers it (the variants are the same three)
    page.select_option("#race-setting", "num_kv_heads")                # the most KV heads against the fewest
    mha = page.input_value("#race-a")
    page.select_option("#race-b", "2")                                  # GQA instead
    page.select_option("#f-model", "target-mha")
    wait_until(page, "document.querySelector('#race-b option[value=eagle]')")
    assert page.input_value("#race-setting") == "num_kv_heads"
    assert (page.input_value("#race-a"), page.input_value("#race-b")) == (mha, "2")
    # γ = 2 against γ = 6: the sides pick γ's options, not the KV heads' "2" of the same value
    page.select_option("#race-setting", "num_speculative_tokens")
    assert [page.eval_on_selector(f"#race-{side}", "s => s.selectedOptions[0].dataset.setting + '=' + s.value")
            for side in "ab"] == ["num_speculative_tokens=2", "num_speculative_tokens=6"]
    assert page.recorder.errors == []


def test_views_switch_by_tab_keep_the_url_and_hide_in_embed(live_server, page):
    open_page(page, url(live_server, "/embed", view="memory", hide="tabs,settings"))
    assert page.is_hidden(".teach-tabs") and page.is_visible("#view-memory")
    open_page(page, url(live_server, view="theory", hide="race"))
    assert page.locator("#tab-race").count() == 0
    page.click("#tab-memory")
    only_view(page, "memory")
    page.select_option("#f-num_speculative_tokens", "6")              # the page rewrites its URL; the view stays
    assert "view=memory" in page.url and "num_speculative_tokens=6" in page.url and "hide=race" in page.url
    page.click("#tab-memory")                                         # the open tab again closes it
    assert "view=" not in page.url
    assert page.eval_on_selector_all("[data-view-panel]", "els => els.filter(e => !e.hidden).length") == 0
    assert page.recorder.errors == []


def test_theory_view_draws_suffix_decoding_s_draft_length_by_match_length(live_server, page):
    """A suffix decoding run: the Theory view shows its chart of draft length by match length, over every drafting
    round the server counted, and names each match length's mean draft and the rule's bound."""
    open_page(page, url(live_server, view="theory", method="suffix", num_speculative_tokens=6, max_tokens=80,
                        speed="max", prompt=PROMPT))
    assert page.locator("#theory-suffix-figure").is_hidden()
    page.click("#btn-toggle")
    wait_state(page, "done")
    key = page.get_attribute("#stream", "data-recording")
    series = page.evaluate(f"fetch('/teach/theory.json?recording={key}').then(r => r.json())")["suffix"]
    assert series and sum(series["drafted"]) > 0
    wait_until(page, "!document.querySelector('#theory-suffix-figure').hidden && document.querySelector("
                     f"'#theory-suffix-figure').dataset.rounds === '{len(series['drafted'])}'")
    note = page.inner_text("#theory-suffix-note")
    assert note.startswith(f"{len(series['drafted'])} rounds")
    shown = {int(m): (float(x), int(b)) for m, x, b in re.findall(r"(\d+) → ([\d.]+) \((\d+)\)", note)}
    assert sorted(shown) == [b["match_len"] for b in series["by_match"]]
    for b in series["by_match"]:                                       # to the one decimal shown
        assert shown[b["match_len"]][0] == pytest.approx(b["drafted"], abs=0.05 + 1e-9)
        assert shown[b["match_len"]][1] == b["bound"]
    assert page.recorder.errors == []
