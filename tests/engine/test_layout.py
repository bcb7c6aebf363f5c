"""Weight layouts for models beyond the caches (engine/model/layout.py): the same products and the same logits."""
import numpy as np
import pytest

from engine.kv.cache import KVCacheManager
from engine.model.layout import FEW_ROWS, LAYOUTS, stream_ms, use_fastest_layout, use_layout, weight_bytes, weights_of
from engine.model.llama import forward


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_computes_the_same_products(layout):
    """Every row count takes its own call pattern: one row, a few rows, many rows; widths that do not divide
    into panels or blocks (one panel; a short last block)."""
    rng = np.random.default_rng(0)
    for d in (640, 700):
        w = rng.standard_normal((96, d)).astype(np.float32)
        lw = LAYOUTS[layout](w)
        assert np.array_equal(lw.to_array(), w) and lw.nbytes == w.nbytes
        x = rng.standard_normal((40, 96)).astype(np.float32)
        np.testing.assert_allclose(lw.vec(x[0]), x[0] @ w, rtol=1e-5, atol=1e-4)
        for n in (1, 2, 3, 5, FEW_ROWS, FEW_ROWS + 1, 40):
            np.testing.assert_allclose(lw.rows(x[:n]), x[:n] @ w, rtol=1e-5, atol=1e-4)


def test_panel_row_counts_run_padded_or_row_by_row_where_that_is_faster(monkeypatch):
    """`pad_rows` times 1 .. FEW_ROWS rows through an LM head and sets the process's padding and its row-by-row
    counts from it: each count to a larger one only, or row by row (never one row, never both); padded, row by
    row or neither, n rows give the product of n rows (one row too, as a GEMV a panel or as two rows), and row
    by row each row's floats are those of its own one-row GEMV."""
    from engine.model.layout import PanelWeight, pad_rows
    monkeypatch.setattr(PanelWeight, "padded_rows", {})
    monkeypatch.setattr(PanelWeight, "row_by_row", frozenset())
    head = PanelWeight(np.random.default_rng(1).standard_normal((96, 640)).astype(np.float32))
    plan = pad_rows(head)
    assert PanelWeight.padded_rows == plan and all(1 <= n < m <= FEW_ROWS for n, m in plan.items())
    assert PanelWeight.row_by_row <= set(range(2, FEW_ROWS + 1)) - set(plan)
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((96, 640)).astype(np.float32), rng.standard_normal((FEW_ROWS, 96)).astype(np.float32)
    for padded, one_by_one in (({}, ()), ({1: 2, 3: 4}, ()), ({n: FEW_ROWS for n in range(1, FEW_ROWS)}, ()),
                               ({}, range(2, FEW_ROWS + 1)), ({3: 4}, (2, 5))):
        monkeypatch.setattr(PanelWeight, "padded_rows", padded)
        monkeypatch.setattr(PanelWeight, "row_by_row", frozenset(one_by_one))
        lw = PanelWeight(w)
        np.testing.assert_allclose(lw.vec(x[0]), x[0] @ w, rtol=1e-5, atol=1e-4)
        for n in range(1, FEW_ROWS + 1):
            out = lw.rows(x[:n])
            assert out.shape == (n, 640)
            np.testing.assert_allclose(out, x[:n] @ w, rtol=1e-5, atol=1e-4)
            if n in one_by_one:
                gemv = [np.concatenate(list(np.matmul(x[j:j + 1], lw.panels)), axis=1) for j in range(n)]
                assert np.array_equal(out, np.concatenate(gemv))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_gives_the_plain_model_s_logits(make_model, layout):
    """Prefill, decode steps (`decode`, through the layout's one-row product), a verification of 4 rows and
    one of 12, in either layout, against the same model with plain arrays."""
    plain, weights = make_model("tiny", hidden_size=128, intermediate_size=320, vocab_size=704, seed=5)
    stored = use_layout(type(plain)(plain.cfg, weights), layout)
    tokens = np.random.default_rng(6).integers(0, plain.cfg.vocab_size, 40)
    runs = []
    for model in (plain, stored):
        mgr = KVCacheManager(model.cfg, num_blocks=6, block_size=8)
        seq = mgr.new_sequence()
        out = [model_forward(model, tokens[:20], 0, mgr, seq)]
        out += [model_forward(model, tokens[p:p + 1], p, mgr, seq) for p in (20, 21, 22, 23)]
        out.append(model_forward(model, tokens[24:28], 24, mgr, seq))
        out.append(model_forward(model, tokens[28:40], 28, mgr, seq))
        runs.append(np.concatenate(out))
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-4, atol=1e-4)
    assert (runs[1].argmax(-1) == runs[0].argmax(-1)).all()


def model_forward(model, tokens, p0, mgr, seq):
    return forward(model, tokens, p0, mgr.append_slots(seq, tokens))


def test_the_faster_layout_is_chosen_and_the_floor_covers_every_weight_byte(make_model, monkeypatch):
    from engine.model.layout import PanelWeight
    for name in ("padded_rows", "row_by_row", "measured"):    # what the choice measures here: this test's only
        monkeypatch.setattr(PanelWeight, name, getattr(PanelWeight, name))
    model, _ = make_model("tiny", hidden_size=128, intermediate_size=320, vocab_size=704)
    use_fastest_layout(model)
    assert model.layout == min(model.layout_ms, key=model.layout_ms.get)
    c, v, i = 128, 704, 320
    cfg = model.cfg
    qkv = c * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    per_layer = qkv + cfg.num_attention_heads * cfg.head_dim * c + c * 2 * i + i * c
    assert weight_bytes(model) == 4 * (cfg.num_hidden_layers * per_layer + c * v)
    assert stream_ms(model, repeats=2) > 0


def test_the_padding_is_measured_by_the_first_model_and_kept(make_model, monkeypatch):
    """A later model's load never changes the padding: it changes the last bits of every panel product, so a model
    loaded before would compute other floats mid-run (a seeded run would then not repeat)."""
    from engine.model import layout
    for name, value in (("padded_rows", {}), ("row_by_row", frozenset()), ("measured", False)):
        monkeypatch.setattr(layout.PanelWeight, name, value)
    plans = iter([{1: 4}, {1: 2, 3: 4}])
    measured = []

    def pad_rows(head):
        measured.append(head)
        layout.PanelWeight.padded_rows = next(plans)
    monkeypatch.setattr(layout, "pad_rows", pad_rows)
    for seed in (1, 2):
        model, _ = make_model("tiny", hidden_size=128, intermediate_size=320, vocab_size=704, seed=seed)
        use_fastest_layout(model)
    assert len(measured) == 1 and layout.PanelWeight.padded_rows == {1: 4}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_step_reads_its_weights_from_one_buffer_in_order(make_model, layout):
    """Each matrix follows the one before it in memory, in the order a step multiplies by them."""
    plain, weights = make_model("tiny", hidden_size=128, intermediate_size=320, vocab_size=704, seed=5)
    stored = use_layout(type(plain)(plain.cfg, weights), layout)
    arrays = [w.data for w in weights_of(stored)]
    base = arrays[0].base
    assert base is not None and all(a.base is base for a in arrays)
    starts = [a.ctypes.data for a in arrays]
    assert starts == [starts[0] + sum(a.nbytes for a in arrays[:i]) for i in range(len(arrays))]
