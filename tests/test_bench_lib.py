"""The benches' harness (cli/bench/lib.py): turns, paired speed-ups by compare.py's rule, tables, the machine line and
the sections of docs/benchmarks.md, which a bench rewrites between its markers only."""
import argparse

from cli.bench import lib


def test_sides_take_turns_in_order_and_reversed_by_rounds():
    order = []
    sides = {name: (lambda name=name: order.append(name) or len(order)) for name in "abc"}
    out = lib.take_turns(sides, 3)
    assert order == list("abccbaabc")
    assert out == {"a": [1, 6, 7], "b": [2, 5, 8], "c": [3, 4, 9]}
    order.clear()
    lib.take_turns(sides, 2, abba=False)
    assert order == list("abcabc")


def test_a_paired_speed_up_is_the_median_of_the_rounds_with_compare_s_verdict():
    s = lib.paired([10.0, 12.0, 11.0], [5.0, 6.0, 5.0])          # before / after: 2.0, 2.0, 2.2
    assert s["median"] == 2.0 and s["verdict"] == "faster" and (s["low"], s["high"]) == (2.0, 2.2)
    assert lib.paired([10.0, 10.0, 10.0], [10.0, 10.1, 9.9])["verdict"] == lib.speedup([1, 1, 1], 3)["verdict"]
    assert lib.shown(lib.paired([4.0], [2.0])).startswith("2.00x (2.00-2.00, ")
    assert lib.shown(None) == "–"
    rates = lib.paired_rates([{"tokens_per_s": 10.0}], [{"tokens_per_s": 15.0}])
    assert abs(rates["median"] - 1.5) < 1e-12


def test_tables_come_from_rows():
    text = lib.table(["what", "x", "ok"], [["a", 1.234, True], ["b", None, False]], "Title")
    assert text.splitlines() == ["**Title**", "", "| what | x | ok |", "|---|---|---|", "| a | 1.23 | yes |",
                                 "| b | – | **no** |"]
    g = lib.goals([("fast", 1.3, ">=", 1.25), ("small", 0.2, "<=", 0.1, "20%"), ("missing", None, ">=", 1)])
    assert g.splitlines()[2:] == ["| fast | 1.30 | >= 1.25 | yes |", "| small | 20% | <= 0.1 | **no** |",
                                  "| missing | – | >= 1 | **no** |"]


def test_a_section_is_rewritten_between_its_markers_only(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\nprose before\n\n<!-- bench x: start -->\nold\n<!-- bench x: end -->\n\nprose after\n")
    lib.write_section("x", "new table", doc)
    assert doc.read_text() == ("# B\n\nprose before\n\n<!-- bench x: start -->\nnew table\n<!-- bench x: end -->\n\n"
                               "prose after\n")
    lib.write_section("y z", "t", doc)                    # no markers yet: a section of its own at the end
    assert doc.read_text().endswith("prose after\n\n## `bench y z`\n\n<!-- bench y z: start -->\nt\n<!-- bench y z: end -->\n")


def test_a_bench_prints_and_writes_its_tables_then_one_machine_line(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("<!-- bench demo: start -->\n<!-- bench demo: end -->\n<!-- bench other: start -->\n"
                   "<!-- bench other: end -->\n")
    monkeypatch.setattr(lib, "DOCS", doc)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    lib.add_bench(sub, "demo", "a demo", lambda args: {"machine": lib.machine(), "n": 3, **args.extra},
                  lambda r: [lib.table(["n"], [[r["n"]]])], quick="one repeat")

    def run(*argv, extra=None):
        args = parser.parse_args(["demo", *argv])
        args.extra = extra or {}
        return args.func(args)
    before = doc.read_text()
    assert run("--quick") == 0 and doc.read_text() == before             # a smoke run writes nothing
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[:3] == ["| n |", "|---|", "| 3 |"] and printed[-1].startswith("Machine: ")
    assert run() == 0
    body = doc.read_text().split("<!-- bench demo: start -->\n")[1].split("\n<!-- bench demo: end -->")[0]
    lines = body.splitlines()
    assert lines[:3] == ["| n |", "|---|", "| 3 |"] and len(lines) == 5
    assert lines[-1].startswith("Machine: ") and " cores), Python " in lines[-1] and "; load " in lines[-1]
    assert run(extra={"section": "other", "ok": False}) == 1               # another section, a missed goal
    assert "| 3 |" in doc.read_text().split("<!-- bench other: start -->")[1]
    assert run("--no-write", "--json") == 0 and '"n": 3' in capsys.readouterr().out
