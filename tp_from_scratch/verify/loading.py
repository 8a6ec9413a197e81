"""Finding the Adapter an argument names: ``module:NAME`` or ``path/to/file.py:NAME``."""
import importlib
import importlib.util
import sys
from pathlib import Path

from tp_from_scratch.verify.adapter import Adapter


def load_adapter(spec):
    """The Adapter that ``module:NAME`` or ``path/to/file.py:NAME`` names (NAME may also be a
    function returning one). A file is loaded with its own folder first on sys.path, so it
    can import the modules beside it (your library, say)."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"adapter {spec!r}: expected module:NAME or file.py:NAME")
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"adapter {spec!r}: no file {where}")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        loaded = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    if not hasattr(module, name):
        raise AttributeError(f"adapter {spec!r}: {where} has no {name}")
    adapter = getattr(module, name)
    adapter = adapter if isinstance(adapter, Adapter) else adapter()
    if not isinstance(adapter, Adapter):
        raise TypeError(f"{spec} is a {type(adapter).__name__}, not a tp_from_scratch.verify.Adapter")
    return adapter
