"""SmolLM2 on several threads (engine/model/threads.py): the same greedy tokens, plain and speculative, and a
choice measured at load that says why."""
import pytest

from engine.model import thread_choice as C
from engine.model import threads as T

PROMPT = "Explain glaciers in simple terms."


@pytest.fixture
def restore_threads():
    before = T.threads()
    yield
    T.set_threads(before)


@pytest.mark.parametrize("method", ["none", "eagle", "ngram"])
def test_greedy_output_is_identical_at_every_thread_count(run_session, method, restore_threads):
    runs = {}
    for threads in (1, 2, 3):
        T.set_threads(threads)
        summary, tokens = run_session(PROMPT, chat=True, method=method, num_speculative_tokens=3, max_tokens=32)
        runs[threads] = (summary["text"], [t.id for t in tokens])
    assert runs[2] == runs[1] and runs[3] == runs[1]


def test_loading_measured_every_thread_count_and_said_why(smollm2):
    choice = C.current_choice()
    assert choice is not None and choice.reason
    assert set(choice.step_ms) == set(choice.read_ms) == set(range(1, C.candidate_threads(choice.cores) + 1))
    assert choice.weight_bytes > 500e6
    assert choice.auto_threads in choice.step_ms
