"""The layers of docs/architecture.md, read from the code's imports with `ast` (nothing is imported).

Fails when app/ imports cli/, when engine/ imports app/ or cli/, when a module imports itself back through a
circle inside app/ or engine/, or when a function imports a module of the project (the usual way around a
circle; cli/'s commands may import lazily, to keep the command line's start-up short)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def resolve(node: ast.ImportFrom, module: str, is_package: bool, known: dict) -> list[str]:
    """The project modules an import names (`from . import x` names x when x is a module)."""
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in known else target)
    return out


def imports(path: Path, module: str, known: dict) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of a project module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node, in_function: bool, in_type_checking: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue                        # for annotations only: never executed
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                names = resolve(child, module, path.name == "__init__.py", known)
            for name in names:
                while name and name not in known and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in known:
                    found.append((name, child.lineno, in_function))
            visit(child, inner, in_type_checking)

    visit(tree, False, False)
    return found


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    known = modules()
    return {m: imports(p, m, known) for m, p in known.items()}


def layer(module: str) -> str:
    return module.split(".")[0]


def test_layers_import_downwards_only():
    forbidden = {("app", "cli"), ("engine", "app"), ("engine", "cli")}
    wrong = [f"{m} (line {line}) imports {target}" for m, found in graph().items() for target, line, _ in found
             if (layer(m), layer(target)) in forbidden]
    assert wrong == []


def test_no_import_circles_in_app_or_engine():
    g = {m: sorted({t for t, _, _ in found if layer(t) == layer(m) and t != m})
         for m, found in graph().items() if layer(m) in ("app", "engine")}
    # Tarjan's strongly connected components: any component of more than one module is a circle
    index, low, stack, on_stack, circles, counter = {}, {}, [], set(), [], [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            connect(v)
    assert circles == []


def test_no_project_imports_inside_functions_in_app_or_engine():
    """An import inside a function is how a circle hides: app/ and engine/ import at the top.
    (engine/training/ is the training command line's, which imports lazily like cli/.)"""
    inside = [f"{m} (line {line}) imports {target}" for m, found in graph().items() for target, line, in_function
              in found if in_function and layer(m) in ("app", "engine") and not m.startswith("engine.training")]
    assert inside == []


def test_the_reader_sees_imports():
    """The test itself: a known import is found, relative and absolute (so an empty graph cannot pass)."""
    g = graph()
    assert any(t == "engine.serving.registry" for t, _, _ in g["engine.serving.session"])
    assert any(layer(t) == "engine" for t, _, _ in g["app.main"] + g["app.protocol"])


# What each room of app/ may import of app/ (docs/architecture.md's table); engine/ is open to all of them.
ALLOWED_IN_APP = {
    "app.protocol": (),
    "app.views": ("app.protocol", "app.paths", "app.presets", "app.views"),
    "app.watch": ("app.protocol", "app.ws.socket", "app.config", "app.logs", "app.watch"),
    "app.ws": ("app.protocol", "app.config", "app.logs", "app.security", "app.ws"),
    "app.config": ("app.paths",),
    "app.metrics": (),
    "app.security": ("app.config",),
}


def test_each_room_of_app_imports_only_what_the_architecture_allows():
    wrong = []
    for module, found in graph().items():
        room = next((r for r in ALLOWED_IN_APP if module == r or module.startswith(r + ".")), None)
        if room is None:
            continue
        for target, line, _ in found:
            if layer(target) == "app" and not any(target == a or target.startswith(a + ".") for a in
                                                  ALLOWED_IN_APP[room]):
                wrong.append(f"{module} (line {line}) imports {target}")
    assert wrong == []


# What each room of engine/ may import of engine/ (docs/architecture.md's table; each package's __init__ says
# the same). The rooms stand on floors: a room imports only rooms below it, never one beside or above.
ALLOWED_IN_ENGINE = {
    "engine.model": (),
    "engine.kv": ("engine.model",),
    "engine.spec_decode": ("engine.model", "engine.kv"),
    "engine.serving": ("engine.model", "engine.kv", "engine.spec_decode"),
    "engine.external": ("engine.serving.events", "engine.serving.settings"),
    "engine.experiments": ("engine.model", "engine.kv", "engine.spec_decode", "engine.serving", "engine.external"),
    "engine.training": ("engine.model", "engine.kv", "engine.spec_decode", "engine.serving"),
}
# The numpy model and what runs it: a client of another engine reaches none of these, not even through
# the vocabulary it shares with our engine (events, settings; these know the cache dtypes' names).
NUMPY_MODEL = ("engine.model.llama", "engine.model.layout", "engine.kv.cache", "engine.kv.runner",
               "engine.kv.block_pool", "engine.spec_decode")


def room_of(module: str, rooms) -> str | None:
    return next((r for r in rooms if module == r or module.startswith(r + ".")), None)


def test_each_room_of_engine_imports_only_the_rooms_below_it():
    g = graph()
    homeless = [m for m in g if layer(m) == "engine" and m != "engine" and room_of(m, ALLOWED_IN_ENGINE) is None]
    assert homeless == [], "every module of engine/ lives in a room (a new one needs its line here)"
    wrong = []
    for module, found in g.items():
        room = room_of(module, ALLOWED_IN_ENGINE)
        if room is None:
            continue
        for target, line, _ in found:
            if layer(target) == "engine" and target != "engine" and room_of(target, (room,)) is None and \
                    room_of(target, ALLOWED_IN_ENGINE[room]) is None:
                wrong.append(f"{module} (line {line}) imports {target}")
    assert wrong == []


def test_clients_of_other_engines_do_not_reach_the_numpy_model():
    g = {m: {t for t, _, _ in found} for m, found in graph().items()}
    reached = {}
    for start in (m for m in g if room_of(m, ("engine.external",))):
        seen, todo = set(), [start]
        while todo:
            for t in g.get(todo.pop(), ()):
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        numpy_model = sorted(t for t in seen if room_of(t, NUMPY_MODEL))
        if numpy_model:
            reached[start] = numpy_model
    assert reached == {}
