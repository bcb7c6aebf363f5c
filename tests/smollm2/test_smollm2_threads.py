"""SmolLM2 on several threads (engine/model/threads.py): the same greedy tokens, plain and speculative, and a
thread choice made at load that says why."""
import pytest

from engine.model import thread_choice as C
from engine.model import threads as T

PROMPT = "Explain glaciers in simple terms."


@pytest.fixture
def restore_threads():
    before = T.threads()
    yield
    C.request_threads(None)
    T.set_threads(before)


@pytest.mark.parametrize("method", ["none", "eagle", "ngram"])
def test_greedy_output_is_identical_at_every_thread_count(run_session, method, restore_threads):
    runs = {}
    for threads in (1, 2, 3):
        T.set_threads(threads)
        summary, tokens = run_session(PROMPT, chat=True, method=method, num_speculative_tokens=3, max_tokens=32)
        runs[threads] = (summary["text"], [t.id for t in tokens])
    assert runs[2] == runs[1] and runs[3] == runs[1]


def test_loading_chose_a_thread_count_and_said_why(smollm2):
    choice = C.current_choice()
    assert choice is not None and choice.reason and 1 <= choice.threads <= C.MAX_THREADS
    assert all(ms > 0 for ms in choice.read_ms.values())


def test_the_cost_view_shows_the_roofline_per_thread_count(smollm2_dir, models_dir, restore_threads):
    """Cost model view on SmolLM2: a row per thread count (read bandwidth, the step it predicts, the step
    measured), the server's own count marked; the curve is measured again for another thread count."""
    import re

    from fastapi.testclient import TestClient

    from app.config import AppConfig
    from app.main import create_app

    with TestClient(create_app(AppConfig(models_dir=models_dir, threads=2)), base_url="http://localhost") as client:
        html = client.get("/teach/cost", params={"model": "smollm2-135m", "gamma": "3"}).text
        rows = re.findall(r'<tr( class="run-row")? data-threads="(\d+)">(.*?)</tr>', html, re.S)
        assert [int(n) for _, n, _ in rows] == list(range(1, max(2, C.candidate_threads(C.available_cores())) + 1))
        assert [n for marked, n, _ in rows if marked] == ["2"]
        for _, _, cells in rows:
            gbps, predicted, measured = (float(re.search(rf'data-figure="{k}">([\d.]+)', cells).group(1))
                                         for k in ("read_gb_per_s", "predicted_ms", "step_ms"))
            assert gbps > 1 and predicted > 5 and measured > 5
        curve = client.get("/teach/curve.json", params={"model": "smollm2-135m"}).json()
        assert curve["threads"] == 2 and len(curve["roofline"]) == len(rows)
    with TestClient(create_app(AppConfig(models_dir=models_dir, threads=1)), base_url="http://localhost") as client:
        assert client.get("/teach/curve.json", params={"model": "smollm2-135m"}).json()["threads"] == 1
