"""One module touches the disk: outside headlab/io*, no headlab module writes, renames, links or
deletes a path, or makes a folder. It hands its bytes to headlab.io (a manifest's writers, a
`ScratchFolder`, `make_folder`), which writes them atomically, confined and without following
links, and deletes only what it made.

Read from the source (ast): every call is judged by what it is, not where it leads, so a write
in a rarely taken branch is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "headlab"

# Module functions that change the file system (module, function).
CHANGING_FUNCTIONS = {
    ("os", name) for name in ("open", "replace", "rename", "renames", "remove", "unlink", "rmdir", "removedirs",
                              "mkdir", "makedirs", "symlink", "link", "truncate", "chmod", "mkfifo")
} | {("shutil", name) for name in ("rmtree", "move", "copy", "copy2", "copyfile", "copytree", "copyfileobj")}
# Path methods that change the file system. Those named like another library's are told apart by
# their form: a Path's `rename`/`replace` take one positional, non-string argument (pandas' and
# str's others), its `write_bytes`/`write_text` one positional argument (headlab.io's writers
# take a file name first).
PATH_METHODS = {"unlink", "rmdir", "mkdir", "touch", "symlink_to", "hardlink_to", "chmod"}
RENAMES = {"rename", "replace"}
CONTENT_WRITES = {"write_bytes", "write_text"}
# Serializers that write a file when handed a path: they may only write into an in-memory buffer
# (`io.BytesIO()`, bound in the same module) or a parameter of a lambda or function (the
# `HashingFile` a headlab.io writer hands them).
SERIALIZERS = {"savefig", "save", "to_csv", "to_parquet", "to_json", "to_pickle", "savez", "savez_compressed",
               "save_file", "dump"}
WRITE_MODES = set("wax+")


def mode_of(call: ast.Call, position: int) -> str | None:
    args = [*call.args[position:position + 1], *(k.value for k in call.keywords if k.arg == "mode")]
    return next((a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)), None)


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return "?"


def disk_changes(source: str) -> list[tuple[int, str]]:
    """(line, call) for every call in `source` that writes, renames, links or deletes a path."""
    tree = ast.parse(source)
    buffers, parameters = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and dotted(node.value.func).endswith(
                "BytesIO"):
            buffers |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call) and dotted(
                node.context_expr.func).endswith("BytesIO") and isinstance(node.optional_vars, ast.Name):
            buffers.add(node.optional_vars.id)
        if isinstance(node, (ast.Lambda, ast.FunctionDef)):
            parameters |= {a.arg for a in node.args.args}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name, func = dotted(node.func), node.func
        method = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        module = name.rsplit(".", 1)[0] if "." in name else ""
        if (module, method) in CHANGING_FUNCTIONS:
            found.append((node.lineno, name))
        elif name == "open" and set(mode_of(node, 1) or "") & WRITE_MODES:
            found.append((node.lineno, f"open(..., {mode_of(node, 1)!r})"))
        elif method == "open" and module and set(mode_of(node, 0 if module not in ("gzip", "tarfile", "bz2", "lzma")
                                                          else 1) or "") & WRITE_MODES:
            found.append((node.lineno, f"{name}(..., {mode_of(node, 1)!r})"))
        elif method in PATH_METHODS and module:
            found.append((node.lineno, name))
        elif method in CONTENT_WRITES and module and len(node.args) == 1:
            found.append((node.lineno, name))
        elif (method in RENAMES and module and len(node.args) == 1 and not node.keywords
              and not (isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))):
            found.append((node.lineno, name))
        elif method in SERIALIZERS and module:
            target = node.args[1] if method in ("save", "dump", "save_file") and len(node.args) > 1 else (
                node.args[0] if node.args and method not in ("save", "dump", "save_file") else None)
            if target is not None and not (isinstance(target, ast.Name) and target.id in buffers | parameters):
                found.append((node.lineno, name))
    return sorted(found)


def outside_io() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if path.relative_to(PACKAGE).parts[0] != "io"]


def test_no_module_but_headlab_io_changes_the_disk():
    calls = [f"{path.relative_to(PACKAGE.parent)}:{line}: {call}" for path in outside_io()
             for line, call in disk_changes(path.read_text(encoding="utf-8"))]
    assert calls == []


def test_the_scan_covers_every_subpackage():
    """Each module of each subpackage is scanned, headlab/runs/ (the run folder's writers) among
    them, so a package added later is judged too and none is skipped by name."""
    scanned = set(outside_io())
    packages = {init.parent for init in PACKAGE.rglob("__init__.py")} - {PACKAGE, PACKAGE / "io"}
    assert PACKAGE / "runs" in packages
    for package in packages:
        assert set(package.glob("*.py")) <= scanned, package


def test_headlab_io_itself_is_seen_writing():
    """The scan sees headlab.io's own writes, so an empty list above is not a blind scan."""
    calls = {call for path in sorted((PACKAGE / "io").glob("*.py"))
             for line, call in disk_changes(path.read_text(encoding="utf-8"))}
    assert {"os.open", "os.replace", "os.rename", "os.rmdir"} <= calls


@pytest.mark.parametrize("source", [
    'open(path, "w")', 'open(path, mode="ab")', 'Path(p).open("w")', 'gzip.open(p, "wb")', "os.replace(a, b)",
    "os.rename(a, b)", "shutil.rmtree(p)", "folder.mkdir(parents=True)", "path.unlink()", "p.write_text(t)",
    "p.write_bytes(b)", "scratch.rename(folder)", "fig.savefig(folder / 'x.png')", "fig.savefig('x.png')",
    "torch.save(state, path)", "table.to_csv(path)", "np.save(path, array)", "os.symlink(a, b)",
])
def test_the_scan_catches_every_kind_of_write(source):
    assert disk_changes(f"from pathlib import Path\n{source}\n") != []


@pytest.mark.parametrize("source", [
    'open(path, "rb")', 'open(path)', 'data.rename(columns={"a": "b"})', 'series.rename("rank")',
    'text.replace("a", "b")', "config.replace(steps=4)", "table.to_csv(index=False)",
    "buffer = io.BytesIO()\nfig.savefig(buffer, format='png')", "lambda file: torch.save(state, file)",
    'manifest.write_bytes("report.md", data)',
])
def test_the_scan_lets_reads_and_in_memory_writes_pass(source):
    assert disk_changes(f"import io\n{source}\n") == []
