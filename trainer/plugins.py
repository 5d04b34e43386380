"""Import paths as extension points: `package.module:attribute` wherever a built-in name is.

Models, datasets and steps are all resolved here, built-ins and user code alike: a name is
looked up among the built-ins first, then imported with importlib. Every failure is a
:class:`PluginError` (exit 2) that says which part failed — the module, the attribute, or the
call — so a typo in a Helm values file is one line in the pod log, not a traceback.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from trainer.errors import ConfigError, TrainerError, first_line

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT_PATH = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")


class PluginError(ConfigError):
    """An import path does not resolve, or the object behind it misbehaves."""


def is_import_path(spec: str) -> bool:
    """True for `package.module:attribute` (dotted names on both sides of one colon)."""
    return bool(_IMPORT_PATH.match(spec))


def load(spec: str, where: str) -> Callable[..., Any]:
    """Import `package.module:attribute` and return the callable it names."""
    if not is_import_path(spec):
        raise PluginError(f"{where}: {spec!r} is not an import path",
                          "write it as package.module:callable")
    module_name, _, attr_path = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise PluginError(
                f"{where}: module {module_name!r} of {spec!r} cannot be imported (no module "
                f"named {missing!r})",
                "pip install the package that provides it (in the image), or add its "
                "directory to PYTHONPATH") from None
        raise PluginError(f"{where}: importing module {module_name!r} failed: {exc}",
                          f"install {missing!r}, which {module_name!r} imports") from None
    except Exception as exc:  # noqa: BLE001 - any error raised by the user's module itself
        raise PluginError(f"{where}: importing module {module_name!r} raised "
                          f"{type(exc).__name__}: {first_line(exc, empty='(no message)')}",
                          "fix the error in that module") from exc
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{where}: module {module_name!r} has no attribute {attr_path!r}",
                              "check the name after ':' in " + repr(spec))
        obj = getattr(obj, part)
    if not callable(obj):
        raise PluginError(f"{where}: {spec!r} is a {type(obj).__name__}, not a callable",
                          "point it at a function or a class")
    return obj  # type: ignore[no-any-return]


def resolve(spec: str, where: str,
            builtins: Mapping[str, Callable[..., Any]]) -> Callable[..., Any]:
    """A built-in entry by name, else the callable behind an import path."""
    if spec in builtins:
        return builtins[spec]
    if not is_import_path(spec):
        raise PluginError(f"{where}: unknown name {spec!r}",
                          f"use one of {', '.join(builtins)} or package.module:callable")
    return load(spec, where)


def accepted(fn: Callable[..., Any], offered: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `offered` that `fn` accepts (all of them under **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: offer everything
        return dict(offered)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(offered)
    names = {p.name for p in params
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return {k: v for k, v in offered.items() if k in names}


def call(fn: Callable[..., Any], kwargs: Mapping[str, Any], where: str, fix: str) -> Any:
    """Call a user callable; anything it raises becomes one PluginError with its message."""
    try:
        return fn(**kwargs)
    except TrainerError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code: report whatever it raised
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            # a package the callable imports is missing here: the code itself is fine
            fix = (f"install {exc.name!r} where the ranks run (pip install it into this "
                   "environment, or into your image)")
        raise PluginError(f"{where}: {describe(fn)}({', '.join(kwargs)}) raised "
                          f"{type(exc).__name__}: {first_line(exc, empty='(no message)')}",
                          fix) from exc


def describe(obj: Any) -> str:
    """`module:qualname` of a function or class (for messages and metric labels)."""
    target = obj.func if hasattr(obj, "func") and hasattr(obj, "keywords") else obj  # partial
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}"
