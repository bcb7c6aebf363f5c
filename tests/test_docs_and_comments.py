"""Comments and docstrings describe the code as it is: the modules they name exist, and they carry no lab diary.

- Every module a comment or docstring names exists: a dotted name (`engine.kv.cache.KVStore`) imports up to its
  last module and the rest are attributes of it; a path (`engine/kv/cache.py`, `app/routers/teach/`) is in the
  repository.
- No comment or docstring in engine/, app/ or cli/ carries a date, "by hand" or an issue number: figures and
  their history live in docs/benchmarks.md and `git log`.

Comments are read with `tokenize`, docstrings with `ast` (module, class and function docstrings); string values
the code uses are not prose and are not checked."""
from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE = ("engine", "app", "cli")                 # where no date, "by hand" or issue number may stand
NAMING = CODE + ("scripts",)                    # where every module named must exist

DOTTED = re.compile(r"(?<![\w./-])((?:engine|app|cli)(?:\.[A-Za-z_]\w*)+)")
PATH = re.compile(r"(?<![\w./-])((?:engine|app|cli|scripts|tests|docs|static|templates)/[\w./-]*)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.\w+)?$")      # models/heads/TARGET/, NAME.json: not a file
DIARY = {
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    '"by hand"': re.compile(r"\bby hand\b", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues?\s+#?\d+|(?<![\w&#/])#\d+\b", re.IGNORECASE),
}


def python_files(folders) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in a file, a docstring line by line."""
    source = path.read_text(encoding="utf-8")
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                out += [(first.lineno + i, line) for i, line in enumerate(first.value.value.splitlines())]
    return sorted(out)


def resolves(dotted: str) -> bool:
    """The longest prefix that imports is a module, and the rest are attributes, one inside the other."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            if e.name is not None and not ".".join(parts[:cut]).startswith(e.name):
                raise                          # the module exists but one of its own imports does not
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def path_exists(text: str) -> bool:
    text = text.rstrip(".")
    if any(PLACEHOLDER.match(part) for part in text.split("/")):
        return True
    return (ROOT / text).exists()


def report(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{file}:\n  " + "\n  ".join(lines) for file, lines in sorted(found.items()))


def named_modules() -> dict[str, list[tuple[int, str, str]]]:
    """file -> (line, kind, name) of every dotted module name and repository path its prose mentions."""
    out = {}
    for path in python_files(NAMING):
        rows = []
        for line, text in prose(path):
            rows += [(line, "module", m) for m in DOTTED.findall(text) if not m.endswith(".py")]
            rows += [(line, "path", m) for m in PATH.findall(text)]
        if rows:
            out[str(path.relative_to(ROOT))] = rows
    return out


def test_prose_is_read_from_comments_and_docstrings_only(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Module: engine.kv.cache."""\nX = "issue 17"  # see engine/kv/cache.py\n\n'
                      'def f():\n    """Two lines,\n    by hand."""\n')
    assert prose(sample) == [(1, "Module: engine.kv.cache."), (2, "# see engine/kv/cache.py"),
                             (5, "Two lines,"), (6, "    by hand.")]


def test_the_patterns_find_what_they_are_for():
    assert DOTTED.findall("the numbers live in `engine.kv_cache.KVStore`; request.app.state") == \
        ["engine.kv_cache.KVStore"]
    assert PATH.findall("(engine/model/layout.py's `pad_rows`, cli/bench/, /tmp/app/x)") == \
        ["engine/model/layout.py", "cli/bench/"]
    assert not resolves("engine.kv_cache.KVStore") and resolves("engine.kv.cache.KVStore")
    assert not path_exists("engine/kv_cache.py") and path_exists("engine/kv/cache.py.")
    assert path_exists("models/heads/TARGET/") and not path_exists("app/nothing/")
    diary = "run 2026-12-04 (by hand), issue 17 and #17; &#39; and issues are words"
    assert [name for name, rx in DIARY.items() if rx.search(diary)] == list(DIARY)
    assert not any(rx.search("# shape [2, 1, 1, 1]; &#39;; colour #3b82f6") for rx in DIARY.values())


def test_every_module_a_comment_or_docstring_names_exists():
    missing = {}
    for file, rows in named_modules().items():
        for line, kind, name in rows:
            if not (resolves(name) if kind == "module" else path_exists(name)):
                missing.setdefault(file, []).append(f"line {line}: {name}")
    assert not missing, "comments and docstrings name modules that do not exist:\n" + report(missing)


@pytest.mark.parametrize("what", list(DIARY))
def test_no_comment_or_docstring_carries_a_lab_diary(what):
    rx, found = DIARY[what], {}
    for path in python_files(CODE):
        for line, text in prose(path):
            if rx.search(text):
                found.setdefault(str(path.relative_to(ROOT)), []).append(f"line {line}: {text.strip()[:110]}")
    assert not found, f"comments and docstrings with {what} (figures and history: docs/benchmarks.md, git log):\n" \
        + report(found)
