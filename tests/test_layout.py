"""The architecture of harness/ and attn/, checked on the source with ``ast`` (nothing here imports the code).

Layers, bottom to top (a module may import its own layer and the layers its row of MAY_IMPORT names):

    bottom     harness.results, .messages, .plugins, .environment, .memory, .presses (and the package ``harness``)
    executors  harness.executors
    cost       harness.cost                 accuracy  harness.accuracy      (never each other)
    analysis   harness.analysis: reads results files, so it may import only the bottom layer
    cli        harness.cli (and harness.check, the `check` command): the only layer that may import every other one

and ``attn`` never imports ``harness``. Every import counts, at any depth (inside functions, under
``if TYPE_CHECKING``, ``"module:attr"`` strings of lazy command tables), and so does every import for
cycles: a function-level import hides a cycle from the loader, not from a reader, so no two modules of
harness or attn may need each other at all. No module is over MAX_LINES lines unless LONG_MODULES names
it with a reason. The self-tests at the end feed the checkers synthetic
violations, so a checker that stopped seeing them fails too.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "attn")
MAX_LINES = 400
# path (relative to the repository) -> why it may be longer than MAX_LINES. Keep it short, and say why.
LONG_MODULES: dict[str, str] = {
    "attn/attention/base.py": "the contract every variant implements: dispatch, the FLOP and byte counts a harness mode "
                              "charges, decoding; splitting the counts out would split one class across modules",
    "attn/attention/linear.py": "one variant's feature maps, its chunked, recurrent and fla backends and its state; the "
                                "chunked form's grouped steps carry their own derivation",
}

BOTTOM = ("harness.results", "harness.schema", "harness.messages", "harness.plugins", "harness.environment",
          "harness.memory", "harness.presses")
# layer -> module name prefixes (a prefix matches the module and everything under it)
LAYERS: dict[str, tuple[str, ...]] = {
    "bottom": BOTTOM,
    "executors": ("harness.executors",),
    "cost": ("harness.cost",),
    "accuracy": ("harness.accuracy",),
    "analysis": ("harness.analysis",),
    "cli": ("harness.cli", "harness.__main__", "harness.check"),
}
MAY_IMPORT: dict[str, set[str]] = {
    "bottom": {"bottom"},
    "executors": {"bottom", "executors"},
    "cost": {"bottom", "executors", "cost"},
    "accuracy": {"bottom", "executors", "accuracy"},
    "analysis": {"bottom", "analysis"},
    "cli": set(LAYERS),
}
LAZY_TARGET = re.compile(r"^((?:harness|attn)(?:\.\w+)+):\w+$")  # "harness.cost.command:sweep_command"


# -- reading the source ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # the module imported (a submodule when ``from pkg import sub`` names one, else the package)
    line: int
    load_time: bool  # runs when the importer is imported: not inside a function, not under ``if TYPE_CHECKING``


@dataclass
class Module:
    name: str
    path: str  # relative to the repository, for messages
    source: str
    is_package: bool = False
    imports: list[Import] = field(default_factory=list)

    @property
    def lines(self) -> int:
        return len(self.source.splitlines())


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def parse_imports(name: str, source: str, is_package: bool, known: set[str]) -> list[Import]:
    """Every import of ``harness`` or ``attn`` in ``source``, relative ones resolved; ``known``: the modules that exist."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    found: list[Import] = []

    def add(target: str, line: int, load_time: bool) -> None:
        if target.split(".")[0] in PACKAGES:
            found.append(Import(name, target, line, load_time))

    def visit(node: ast.AST, load_time: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), False)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), load_time)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child.lineno, load_time)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base_parts = package[: len(package) - (child.level - 1)] if child.level > 1 else package
                    base = ".".join(base_parts + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    add(sub if alias.name != "*" and sub in known else base, child.lineno, load_time)
            elif isinstance(child, ast.Call) and _dynamic_import(child):
                add(_dynamic_import(child), child.lineno, False)
            elif isinstance(child, ast.Constant) and isinstance(child.value, str) and LAZY_TARGET.match(child.value):
                add(LAZY_TARGET.match(child.value).group(1), child.lineno, False)
            else:
                visit(child, load_time)

    visit(ast.parse(source), True)
    return found


def _dynamic_import(call: ast.Call) -> str:
    """The module of ``importlib.import_module("x")`` / ``__import__("x")`` with a literal name, else ''."""
    f = call.func
    named = (isinstance(f, ast.Attribute) and f.attr == "import_module") or (isinstance(f, ast.Name) and f.id in (
        "import_module", "__import__"))
    if named and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return ""


def build_modules(sources: dict[str, tuple[str, bool]], paths: dict[str, str] | None = None) -> dict[str, Module]:
    """Modules from {name: (source, is_package)}, their imports parsed."""
    known = set(sources)
    modules = {n: Module(n, (paths or {}).get(n, n), s, pkg) for n, (s, pkg) in sources.items()}
    for m in modules.values():
        m.imports = parse_imports(m.name, m.source, m.is_package, known)
    return modules


def scan(root: Path = ROOT) -> dict[str, Module]:
    sources, paths = {}, {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root)
            parts = list(rel.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            sources[name] = (path.read_text(encoding="utf-8"), is_package)
            paths[name] = rel.as_posix()
    return build_modules(sources, paths)


# -- the rules -----------------------------------------------------------------------------------------

def layer_of(module: str) -> str | None:
    """The layer of a harness module, None outside harness or unknown."""
    if module == "harness":
        return "bottom"
    for layer, prefixes in LAYERS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    return None


def unclassified(modules: dict[str, Module]) -> list[str]:
    return sorted(f"{m.path}: module {n} is in no layer; add it to LAYERS in tests/test_layout.py"
                  for n, m in modules.items() if n.startswith("harness") and layer_of(n) is None)


def layer_violations(modules: dict[str, Module]) -> list[str]:
    """Every import that breaks a layer rule, as 'path:line: importer imports target (rule)'."""
    out = []
    for m in modules.values():
        for imp in m.imports:
            why = _why_not(imp.importer, imp.target)
            if why:
                out.append(f"{m.path}:{imp.line}: {imp.importer} imports {imp.target} ({why})")
    return sorted(out)


def _why_not(importer: str, target: str) -> str:
    top = importer.split(".")[0]
    if top == "attn":
        return "attn never imports harness" if target.split(".")[0] == "harness" else ""
    if target.split(".")[0] != "harness":
        return ""
    have, want = layer_of(importer), layer_of(target)
    if have is None or want is None:
        return "" if have is None else f"{target} is in no layer"
    if want in MAY_IMPORT[have]:
        return ""
    if want == "cli":
        return "nothing below harness.cli imports harness.cli"
    if {have, want} == {"cost", "accuracy"}:
        return "harness.cost and harness.accuracy never import each other"
    if have == "analysis":
        return "harness.analysis may import only the bottom layer"
    return f"layer {have} may import only {', '.join(sorted(MAY_IMPORT[have]))}; {target} is {want}"


def import_graph(modules: dict[str, Module], load_time_only: bool = False) -> dict[str, set[str]]:
    """module -> the modules of harness and attn it imports (at any depth unless ``load_time_only``), with the packages
    above each target that are not above the importer too (importing ``a.b.c`` from outside ``a.b`` runs
    ``a/b/__init__`` first)."""
    graph: dict[str, set[str]] = {n: set() for n in modules if n.split(".")[0] in PACKAGES}
    for n in graph:
        own = {".".join(n.split(".")[:i]) for i in range(1, n.count(".") + 2)}
        for imp in modules[n].imports:
            if (load_time_only and not imp.load_time) or imp.target not in graph:
                continue
            parts = imp.target.split(".")
            above = {".".join(parts[:i]) for i in range(1, len(parts))} - own
            graph[n] |= {m for m in above | {imp.target} if m in graph and m != n}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(found)


def oversized(modules: dict[str, Module], allowed: dict[str, str] = LONG_MODULES,
              limit: int = MAX_LINES) -> list[str]:
    out = [f"{m.path}: {m.lines} lines (limit {limit}); split it, or list it in LONG_MODULES with a reason"
           for m in modules.values() if m.lines > limit and m.path not in allowed]
    paths = {m.path: m for m in modules.values()}
    for path, reason in allowed.items():
        if not reason.strip():
            out.append(f"LONG_MODULES[{path!r}] gives no reason")
        elif path not in paths:
            out.append(f"LONG_MODULES lists {path}, which does not exist")
        elif paths[path].lines <= limit:
            out.append(f"LONG_MODULES lists {path}, which is {paths[path].lines} lines now: remove the entry")
    return sorted(out)


# -- the repository ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def repo() -> dict[str, Module]:
    modules = scan()
    assert "harness.results" in modules and "attn.registry" in modules, "scan found no modules: wrong ROOT?"
    return modules


def _report(problems: Iterable[str]) -> str:
    return "\n".join(problems)


def test_every_harness_module_is_in_a_layer(repo):
    assert not (bad := unclassified(repo)), _report(bad)


def test_imports_respect_the_layers(repo):
    assert not (bad := layer_violations(repo)), _report(bad)


def test_no_import_cycles_at_any_depth(repo):
    found = cycles(import_graph(repo))
    assert not found, _report(" <-> ".join(c) for c in found)


def test_no_module_is_too_long(repo):
    assert not (bad := oversized(repo)), _report(bad)


# -- the checkers themselves ---------------------------------------------------------------------------

def _synthetic(files: dict[str, str]) -> dict[str, Module]:
    """Modules from {"harness/x/y.py": source}."""
    sources, paths = {}, {}
    for path, src in files.items():
        parts = path.removesuffix(".py").split("/")
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        sources[name], paths[name] = (src, is_package), path
    return build_modules(sources, paths)


def test_parse_resolves_relative_nested_and_lazy_imports():
    mods = _synthetic({
        "harness/__init__.py": "",
        "harness/cost/__init__.py": "from . import sweep\nfrom .sweep import run\n",
        "harness/cost/sweep.py": (
            "from typing import TYPE_CHECKING\nfrom ..executors import base\nfrom .. import results\n"
            "import numpy\nif TYPE_CHECKING:\n    from harness.accuracy.runner import Plan\n"
            "def f():\n    from harness.analysis import frames\n    import importlib\n"
            "    return importlib.import_module('harness.cli')\n"
            "class C:\n    from attn import registry\n"
            "COMMANDS = {'x': 'harness.accuracy.cli:accuracy_command'}\n"),
        "harness/executors/__init__.py": "", "harness/executors/base.py": "", "harness/results.py": "",
        "harness/accuracy/__init__.py": "", "harness/accuracy/runner.py": "", "harness/accuracy/cli.py": "",
        "harness/analysis/__init__.py": "", "harness/analysis/frames.py": "", "harness/cli.py": "",
        "attn/__init__.py": "", "attn/registry.py": "",
    })
    got = {(i.target, i.load_time) for i in mods["harness.cost.sweep"].imports}
    assert got == {("harness.executors.base", True), ("harness.results", True), ("harness.accuracy.runner", False),
                   ("harness.analysis.frames", False), ("harness.cli", False), ("attn.registry", True),
                   ("harness.accuracy.cli", False)}
    assert {i.target for i in mods["harness.cost"].imports} == {"harness.cost.sweep"}
    assert import_graph(mods, load_time_only=True)["harness.cost.sweep"] == {
        "attn", "attn.registry", "harness.executors", "harness.executors.base", "harness.results"}


def test_layer_checker_sees_every_kind_of_violation():
    mods = _synthetic({
        "attn/model.py": "def f():\n    from harness.results import x\n",
        "harness/results.py": "from harness.executors import drive\n",
        "harness/executors/__init__.py": "def f():\n    from harness.cost import sweep\n",
        "harness/cost/__init__.py": "", "harness/cost/sweep.py": "from harness.accuracy import runner\n",
        "harness/accuracy/__init__.py": "", "harness/accuracy/runner.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness.cost.sweep import Spec\n"),
        "harness/accuracy/cli.py": "from harness.cli import main\nfrom harness.executors import drive\n",
        "harness/analysis/__init__.py": "from harness.executors import x\nfrom harness.results import y\n",
        "harness/analysis/frames.py": "from harness.accuracy import runner\nfrom . import figures\n",
        "harness/analysis/figures/__init__.py": "from harness.analysis.frames import t\n",
        "harness/cli.py": "from harness.cost import sweep\nfrom harness.analysis import frames\n",
        "harness/oddity.py": "",
    })
    bad = layer_violations(mods)
    expect = [
        "attn/model.py:2: attn.model imports harness.results (attn never imports harness)",
        "harness/results.py:1: harness.results imports harness.executors (layer bottom may import only bottom;",
        "harness/executors/__init__.py:2: harness.executors imports harness.cost.sweep (layer executors",
        "harness/cost/sweep.py:1: harness.cost.sweep imports harness.accuracy.runner (harness.cost and "
        "harness.accuracy never import each other)",
        "harness/accuracy/runner.py:3: harness.accuracy.runner imports harness.cost.sweep (harness.cost and",
        "harness/accuracy/cli.py:1: harness.accuracy.cli imports harness.cli (nothing below harness.cli imports",
        "harness/analysis/__init__.py:1: harness.analysis imports harness.executors (harness.analysis may import only",
        "harness/analysis/frames.py:1: harness.analysis.frames imports harness.accuracy.runner (harness.analysis may",
    ]
    for e in expect:
        assert sum(b.startswith(e) for b in bad) == 1, (e, bad)
    assert len(bad) == len(expect), bad  # allowed ones (cli, own layer, bottom, executors) are not reported
    assert unclassified(mods) == ["harness/oddity.py: module harness.oddity is in no layer; add it to LAYERS in "
                                  "tests/test_layout.py"]


def test_cycle_checker_finds_cycles_at_any_depth():
    mods = _synthetic({
        "harness/accuracy/__init__.py": "",
        "harness/accuracy/runner.py": "from harness.accuracy.fidelity import run\n",
        "harness/accuracy/fidelity.py": "from harness.accuracy import runner\n",  # a load-time cycle
        "harness/accuracy/lm.py": "def f():\n    from harness.accuracy import train\n",
        "harness/accuracy/train.py": "from harness.accuracy.lm import LM\n",  # hidden from the loader only
        "attn/__init__.py": "", "attn/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import attn.b\n",
        "attn/b.py": "'attn.a:thing'\n", "attn/c.py": "import attn.a\n",  # attn too; lazy strings and TYPE_CHECKING count
        "harness/executors/__init__.py": "from harness.executors.slurm import run\n",
        "harness/executors/slurm.py": "from harness.executors.base import drive\n",
        "harness/executors/base.py": "",
        "harness/cost/__init__.py": "from harness.cost.sweep import x\n",
        "harness/cost/sweep.py": "from harness.executors.base import drive\n",  # runs harness/executors/__init__
        "harness/analysis/__init__.py": "from harness.analysis.frames import x\n",
        "harness/analysis/frames.py": "from harness.analysis import x\n",  # a name of the package being loaded
    })
    assert cycles(import_graph(mods, load_time_only=True)) == [["harness.accuracy.fidelity", "harness.accuracy.runner"],
                                                               ["harness.analysis", "harness.analysis.frames"]]
    assert cycles(import_graph(mods)) == [["attn.a", "attn.b"], ["harness.accuracy.fidelity", "harness.accuracy.runner"],
                                          ["harness.accuracy.lm", "harness.accuracy.train"],
                                          ["harness.analysis", "harness.analysis.frames"]]
    mods["harness.executors.base"] = _synthetic({"harness/executors/base.py": "import harness.cost\n"})[
        "harness.executors.base"]
    assert ["harness.cost", "harness.cost.sweep", "harness.executors", "harness.executors.base",
            "harness.executors.slurm"] in cycles(import_graph(mods))


def test_length_checker():
    mods = _synthetic({"harness/big.py": "x = 1\n" * 11, "harness/small.py": "x = 1\n" * 3, "harness/ok.py": "x\n" * 20})
    got = oversized(mods, {"harness/ok.py": "generated", "harness/small.py": "was long", "harness/gone.py": "x",
                           "harness/vague.py": " "}, limit=10)
    assert got == sorted([
        "harness/big.py: 11 lines (limit 10); split it, or list it in LONG_MODULES with a reason",
        "LONG_MODULES lists harness/small.py, which is 3 lines now: remove the entry",
        "LONG_MODULES lists harness/gone.py, which does not exist",
        "LONG_MODULES['harness/vague.py'] gives no reason",
    ])
