"""The one way the lesson generators write a notebook (unexecuted; `make lessons` runs it)."""
import nbformat
from nbformat.v4 import new_notebook

METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


def write_notebook(cells, path):
    """Write ``cells`` as a Python 3 notebook at ``path``."""
    nbformat.write(new_notebook(cells=cells, metadata=METADATA), path)
    print("wrote", path)
