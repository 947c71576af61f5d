"""What the package knows of itself, importing nothing of headlab or torch: its installed version
and the lazy re-exports of its packages. The lowest layer, so any module may use it."""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable


def installed_version() -> str:
    """headlab's version from the installed distribution's metadata."""
    try:
        return version("headlab")
    except PackageNotFoundError:
        return "0+unknown"


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """A package's module `__getattr__` and `__dir__` (PEP 562) and `__all__` for names
    re-exported from its modules (`exports`: module -> names), each module imported on the first
    use of one of its names: importing one module of a package then loads that module only, never
    its siblings. `__dir__` lists the names before they are loaded, so tab completion finds them."""
    module_of = {name: module for module, names in exports.items() for name in names}
    namespace = vars(import_module(package))  # the package's own globals (its submodules, __doc__, ...)

    def __getattr__(name: str) -> Any:
        if name in module_of:
            return getattr(import_module(module_of[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *module_of})

    return __getattr__, __dir__, sorted(module_of)
