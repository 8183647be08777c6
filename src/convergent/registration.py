"""Register convergent's compressed format with transformers on ``import convergent``, lazily.

transformers finds a folder's reader by ``quantization_config.quant_method``, in a mapping
filled by ``register_quantizer``. Importing transformers to fill it would add seconds to
``import convergent``, so the registration waits for transformers: done at once when
``transformers.quantizers.auto`` is already imported, else right after it is (an import hook
that wraps that one module's loader). Every ``from_pretrained`` imports that module first.
"""

from __future__ import annotations

import sys
import warnings

TYPE_CHECKING = False  # not typing's: importing typing (or importlib.abc) costs milliseconds
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

TRIGGER = "transformers.quantizers.auto"


def register_now() -> None:
    """Register the quantizer; a failure is one warning (transformers then cannot read
    compressed folders, and says so by its own error), never an import error."""
    try:
        from convergent.sparse.transformers_quantizer import register_with_transformers

        register_with_transformers()
    except Exception as error:
        warnings.warn(
            f"convergent could not register its compressed format with transformers ({error}); "
            "load compressed folders with convergent.commands.load_sparse",
            RuntimeWarning,
            stacklevel=2,
        )


class _RegisteringLoader:
    """The trigger module's own loader, then :func:`register_now` (an importlib loader by
    its methods, as the import system asks)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        register_now()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _AfterImport:
    """Finds the trigger module with the other finders and wraps its loader, once."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != TRIGGER:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Register now if transformers' quantizers are imported, else when they are."""
    if TRIGGER in sys.modules:
        register_now()
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
