"""The package's layers: data flows one way, model → data → runs → training → analysis → study →
report → cli, and every import of a headlab module is a visible, module-level arrow.

Read from the source (ast), so the check sees every import, including ones inside functions:
no module imports a higher layer, no two modules import each other through any path (a
circle), no function-level import of a headlab module, and no private name crosses modules.
And as Python runs, in an interpreter holding no headlab module (forked from one that has
imported only third-party libraries): a package's __init__ loads none of its modules, so a
module loads only what its own imports reach (no analysis module any training module, no report
module any training module or torch, the spectrum math no torch, headlab.io no torch,
headlab.schema, the tables' vocabulary, nothing outside the standard library)."""

from __future__ import annotations

import ast
import atexit
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "headlab"
LAYERS = ("package", "schema", "io", "model", "data", "runs", "training", "analysis", "study", "report", "cli",
          "__main__", "__init__")
PACKAGES = ("io", "model", "data", "runs", "training", "analysis", "study", "report")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    """The rank of a module's layer: headlab.<layer>[...]; the package's own __init__ is the top."""
    parts = module.split(".")
    return LAYERS.index(parts[1] if len(parts) > 1 else "__init__")


def imports(path: Path) -> list[tuple[str, int, bool, list[str]]]:
    """(imported headlab module, line, at module level, names) for every import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("headlab"):
            names = [a.name for a in node.names]
            modules = [f"{node.module}.{n}" for n in names
                       if (PACKAGE.parent / f"{node.module}.{n}".replace(".", "/")).is_dir()
                       or (PACKAGE.parent / (f"{node.module}.{n}".replace(".", "/") + ".py")).is_file()]
            found.append((node.module, node.lineno, id(node) in top,
                          [n for n in names if f"{node.module}.{n}" not in modules]))
            found += [(m, node.lineno, id(node) in top, []) for m in modules]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append((f"(relative import, level {node.level})", node.lineno, id(node) in top, []))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top, []) for a in node.names if a.name.startswith("headlab")]
    return found


def graph(package: Path = PACKAGE) -> dict[str, dict[str, list]]:
    """module -> {imported headlab module: [(line, at module level, names)]}."""
    edges: dict[str, dict[str, list]] = {}
    for path in sorted(package.rglob("*.py")):
        source = module_name(path)
        edges.setdefault(source, {})
        for target, line, top, names in imports(path):
            edges[source].setdefault(target, []).append((line, top, names))
    return edges


def circles(edges: dict[str, dict[str, list]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), plus self-imports. A package
    importing its own submodules is not a circle: `headlab.x` → `headlab.x.y` is how a package
    re-exports, so an arrow from a package into itself is left out."""
    def inside(source: str, target: str) -> bool:
        return target.startswith(source + ".")

    nodes = sorted(edges)
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in edges or inside(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in edges.get(v, {}):
                found.append(sorted(group))

    for v in nodes:
        if v not in index:
            visit(v)
    return found


def upward(edges: dict[str, dict[str, list]]) -> list[str]:
    """Every import of a module in a higher layer than the importer's."""
    return [f"{source} → {target} (line {line})" for source, targets in edges.items()
            for target, uses in targets.items()
            if target.startswith("headlab.") and layer(target) > layer(source) for line, _, _ in uses]


EDGES = graph()
ANALYSIS_MODULES = sorted(module_name(path) for path in (PACKAGE / "analysis").glob("*.py"))
REPORT_MODULES = sorted(module_name(path) for path in (PACKAGE / "report").rglob("*.py"))


def test_every_headlab_module_has_a_layer():
    assert all(layer(module) >= 0 for module in EDGES)


def test_no_import_circle():
    assert circles(EDGES) == []


def test_no_module_imports_a_higher_layer():
    assert upward(EDGES) == []


def test_every_headlab_import_is_absolute_and_at_module_level():
    hidden = [f"{source} → {target} (line {line})" for source, targets in EDGES.items()
              for target, uses in targets.items() for line, top, _ in uses if not top or target.startswith("(")]
    assert hidden == []


def test_no_private_name_crosses_modules():
    private = [f"{source} imports {name} from {target}" for source, targets in EDGES.items()
               for target, uses in targets.items() for _, _, names in uses for name in names if name.startswith("_")]
    assert private == []


def test_only_the_processes_module_reads_torchruns_environment():
    """One function says which rank a process is (`headlab.training.processes`); a second reading
    of RANK or WORLD_SIZE elsewhere could disagree with it."""
    environment = re.compile(r"""["'](RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE)["']""")
    readers = sorted(module_name(path) for path in PACKAGE.rglob("*.py") if environment.search(path.read_text("utf-8")))
    assert readers == ["headlab.training.processes"]


@pytest.mark.parametrize("arrow,problem", [
    ({"headlab.data.bpe": {"headlab.data.corpus": [(1, True, [])]},
      "headlab.data.corpus": {"headlab.data.bpe": [(1, True, [])]}}, "circle"),
    ({"headlab.model.gpt": {"headlab.analysis.heads": [(1, True, [])]}, "headlab.analysis.heads": {}}, "upward"),
])
def test_the_checks_catch_what_they_guard(arrow, problem):
    """A circle and an upward arrow, as the checks above would meet them."""
    assert bool(circles(arrow)) == (problem == "circle")
    assert bool(upward(arrow)) == (problem == "upward")


# Third-party libraries a parent interpreter imports before it forks one child per module checked:
# which headlab modules an import loads does not depend on them, and the 47 checks then cost a fork
# and headlab's own imports each, not a new interpreter importing torch or pandas again (40 s).
# Each level holds the one below; a check that a module loads none of a level's libraries uses
# the level below it.
NUMERIC = ("numpy", "scipy.linalg", "pandas", "matplotlib.figure", "matplotlib.pyplot", "seaborn", "ipywidgets",
           "IPython.display")
PRELOADS = {"stdlib": (), "numeric": NUMERIC, "torch": (*NUMERIC, "torch"), "torch alone": ("torch",)}

FORK_PER_IMPORT = """
import os, sys
for name in sys.argv[1:]:
    __import__(name)
for line in sys.stdin:
    child = os.fork()
    if child == 0:
        try:
            __import__(line.strip())
            print(" ".join(sys.modules), flush=True)
        except BaseException as error:
            print("failed:", repr(error), flush=True)
        os._exit(0)
    os.waitpid(child, 0)
"""


@functools.cache
def _parent(preload: str) -> subprocess.Popen:
    parent = subprocess.Popen([sys.executable, "-c", FORK_PER_IMPORT, *PRELOADS[preload]], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
    atexit.register(parent.kill)
    return parent


def loaded_modules(module: str, preload: str = "stdlib") -> set[str]:
    """The modules an interpreter holds after `import module`, forked from one that has imported
    only the standard library and the `preload` level's libraries (`PRELOADS`)."""
    parent = _parent(preload)
    parent.stdin.write(module + "\n")
    parent.stdin.flush()
    reply = parent.stdout.readline()
    assert reply and not reply.startswith("failed:"), f"import {module}: {reply or 'the parent interpreter died'}"
    return set(reply.split())


def headlab_modules(modules: set[str]) -> set[str]:
    return {name for name in modules if name.split(".")[0] == "headlab"}


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_a_package_loads_none_of_its_modules(package):
    assert headlab_modules(loaded_modules(f"headlab.{package}")) == {"headlab", "headlab.package", f"headlab.{package}"}


def training_modules(modules: set[str]) -> list[str]:
    return sorted(name for name in headlab_modules(modules) if name.split(".")[:2] == ["headlab", "training"])


@pytest.mark.parametrize("module", ANALYSIS_MODULES)
def test_no_analysis_module_loads_a_training_module(module):
    """Analysis reads run folders through `headlab.runs`: the trainer, its configs and FSDP stay unloaded."""
    assert training_modules(loaded_modules(module, preload="torch")) == []


@pytest.mark.parametrize("module", REPORT_MODULES)
def test_no_report_module_loads_training_or_torch(module):
    """A report is a function of a study's tables: drawing one loads neither the trainer nor torch."""
    loaded = loaded_modules(module, preload="numeric")
    assert training_modules(loaded) == []
    assert "torch" not in loaded


@pytest.mark.parametrize("module", ["headlab.analysis.gram", "headlab.analysis.spectrum"])
def test_the_spectrum_math_loads_no_torch(module):
    assert "torch" not in loaded_modules(module, preload="numeric")


def test_headlab_io_loads_no_torch_importing_module():
    loaded = loaded_modules("headlab.io.manifest", preload="numeric")  # the io module that reaches the most of it
    assert {name for name in headlab_modules(loaded) if not name.startswith("headlab.io")} == {"headlab",
                                                                                             "headlab.package"}
    assert "torch" not in loaded



def test_the_tables_vocabulary_imports_only_the_standard_library():
    """headlab.schema is what the report reads without loading torch: its own imports are stdlib
    modules, and a fresh interpreter importing it holds no other headlab module."""
    tree = ast.parse((PACKAGE / "schema.py").read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module and node.level == 0}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)
    loaded = loaded_modules("headlab.schema")
    assert headlab_modules(loaded) == {"headlab", "headlab.package", "headlab.schema"}
    assert not {"numpy", "pandas", "torch"} & loaded


def test_the_command_lines_parser_loads_neither_torch_nor_pandas():
    """`headlab --help`, `--version` and a usage error answer from the parser alone (headlab.__main__)."""
    assert not {"torch", "pandas", "numpy"} & loaded_modules("headlab.cli.parser")


def test_the_report_and_docs_commands_load_no_torch():
    """`headlab report` and `docs` redraw from tables: the command line's runner and their handlers'
    module load no torch (about 2 s of each here)."""
    for module in ("headlab.cli.main", "headlab.cli.report_commands"):
        assert "torch" not in loaded_modules(module), module


def test_the_train_and_info_commands_load_no_figures_and_no_analysis():
    """A `headlab train` process (each torchrun rank) or `headlab info` loads the command line and
    its handler's module alone: not matplotlib, scipy or the report and analysis modules (0.6-0.9 s
    of every rank's start here)."""
    for module in ("headlab.cli.main", "headlab.cli.model_commands"):
        loaded = loaded_modules(module, preload="torch alone")
        assert not {"matplotlib", "scipy", "seaborn", "headlab.cli.commands"} & loaded, module
        # the two that the parser's path checks use (headlab.cli.paths) are light and load no torch
        figures_or_analysis = {name for name in loaded if name.startswith(("headlab.report", "headlab.analysis."))}
        assert figures_or_analysis <= {"headlab.analysis.gguf_sources", "headlab.analysis.hub"}, module


@pytest.mark.parametrize("package", ["headlab", *(f"headlab.{name}" for name in PACKAGES)])
def test_dir_of_a_package_lists_what_it_exports_before_loading_it(package):
    """Tab completion (dir) finds `headlab.GPT` and the rest while they are still unloaded."""
    module = __import__(package, fromlist=["__all__"])
    assert set(module.__all__) <= set(dir(module))


def test_no_module_of_the_package_is_over_500_lines():
    """One short file per concept: a module that grows past 500 lines holds two concepts; split it."""
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}
