"""Sphinx configuration of the course's website (website/build.py stages the sources and runs Sphinx with it).

Offline by construction: notebooks are shown with their committed outputs (nothing executes),
MathJax is served from the site itself (sphinx-mathjax-offline), the theme bundles its own assets.
"""
import ast
import functools
import inspect
import posixpath
import re
from pathlib import Path

from docutils import nodes
from sphinx.util.osutil import relative_uri

project = "tp_from_scratch"
html_title = "Tensor parallelism from scratch"
extensions = [
    "myst_nb",                  # notebooks and Markdown pages
    "sphinx.ext.autodoc",       # the API pages, from docstrings
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",   # MathJax 3 copied into _static/mathjax, mathjax_path pointing there
    "sphinx_copybutton",        # a copy button on every code cell
    "website.search",           # hyphenated terms, the course's ranking and excerpts (website/search.py)
    "website.references",       # the works the course cites, linked (website/references.py)
]

nb_execution_mode = "off"       # the committed outputs are the lesson: never re-execute
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]  # the lessons write $...$ and $$...$$
myst_heading_anchors = 3
smartquotes = False             # commands stay as typed: --standalone, not an en dash
highlight_language = "none"     # a docstring's table or command is not Python; code cells say their language

autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"      # the docstrings say the shapes; signatures stay short
autodoc_use_type_comments = False  # none written here (Sphinx 8.2+; each function's source read for them)
add_module_names = False        # the section names the module: a signature reads power_of_two_below(p)
# a default as written (MEASUREMENTS / "x.json"), not this machine's path: defaults_as_written below,
# for the few defaults that hold a path (Sphinx's autodoc_preserve_defaults reads the source of every
# one of the 2,000 functions: 10 of the build's 68 s of CPU)
autodoc_preserve_defaults = False

html_theme = "sphinx_book_theme"
html_theme_options = {"show_toc_level": 2, "use_download_button": False, "use_fullscreen_button": False,
                      "footer_content_items": []}  # no "By <author>" line
html_context = {"default_mode": "light"}     # the theme's mode switch logs an error without one
html_static_path = [str(__import__("pathlib").Path(__file__).parent / "_static")]
html_css_files = ["site.css"]
html_js_files = ["site.js"]
html_favicon = "_static/favicon.svg"         # else the browser asks for /favicon.ico and gets a 404
html_copy_source = False        # no _sources/ copy of 3 MB of notebooks
html_show_sourcelink = False
exclude_patterns = ["**.ipynb_checkpoints"]
autodoc_inherit_docstrings = False  # torch.autograd.Function.forward's own docstring is not the course's


def docstring_as_written(app, what, name, obj, options, lines):
    """The course's docstrings are plain text, not reStructuredText: an indented run of lines (a table
    of functions, a command, a shape legend) is shown as a literal block, as it reads in the source."""
    if what == "module" and obj.__doc__:
        # a module's docstring sits at column 0: keep its indents as written (autodoc strips the
        # common indent, which turns a docstring that is all table below its first line into prose)
        raw = [line.rstrip() for line in obj.__doc__.expandtabs().splitlines()]
        lines[:] = [raw[0].strip()] + raw[1:] + [""]
    out, in_block = [], False
    for line in lines:
        indented = line.startswith((" ", "\t")) and line.strip()
        if indented and not in_block:
            out += ["", "::", ""]
        elif not indented and line.strip() and in_block:
            out.append("")
        in_block = bool(indented) or (in_block and not line.strip())
        out.append(line if in_block else plain(line))
    lines[:] = out


def plain(line):
    """A prose line with |, * and a word's trailing _ meant literally (|x|, a * b, exposed_s), outside ``code``."""
    parts = re.split(r"(``.+?``)", line)
    return "".join(p if i % 2 else re.sub(r"([|*]|_(?=\W|$))", r"\\\1", p) for i, p in enumerate(parts))


def link_figures_to_their_files(app, doctree, docname):
    """Each image a page shows links to its file, so a figure shrunk to the column (on a phone,
    labels a few pixels high) opens full size. Sphinx does this for resized images only."""
    if app.builder.format != "html":
        return
    image_folder = relative_uri(app.builder.get_target_uri(docname), app.builder.imagedir)
    for image in list(doctree.findall(nodes.image)):
        if isinstance(image.parent, nodes.reference) or image["uri"] not in app.env.images:
            continue
        link = nodes.reference("", "", internal=True, classes=["full-size"],
                               refuri=posixpath.join(image_folder, app.env.images[image["uri"]][1]))
        image.replace_self(link)
        link.append(image)


REPO = str(Path(__file__).resolve().parent.parent)


class Written:
    """A default shown as its source writes it: repr() is that text."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


@functools.lru_cache(maxsize=None)
def defaults_in(path):
    """{line: (name, {argument: its default's source text})} of every def in a source file, keyed
    by its def line and by its first decorator's (a function's code starts at the decorator)."""
    lines = [line.encode() for line in Path(path).read_text().splitlines(keepends=True)]

    def written(node):   # ast.get_source_segment, without splitting the file again per call
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return lines[first][node.col_offset:node.end_col_offset].decode()
        return b"".join([lines[first][node.col_offset:], *lines[first + 1:last],
                         lines[last][:node.end_col_offset]]).decode()

    found = {}
    for node in ast.walk(ast.parse(b"".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            entry = (node.name, {a.arg: written(d) for a, d in pairs})
            for line in [node.lineno] + [d.lineno for d in node.decorator_list]:
                found[line] = entry
    return found


def defaults_as_written(app, obj, bound_method):
    """Each default shown as the source writes it (MEASUREMENTS / "x.json", DEFAULT_TIMEOUT,
    np.float64), not as its value prints (this clone's path, 30.0, <class 'numpy.float64'>).
    What autodoc_preserve_defaults does, with each file parsed once instead of every function's
    source read again (that cost 10 of the build's 68 s of CPU)."""
    func = inspect.unwrap(getattr(obj, "__func__", obj))
    if not inspect.isfunction(func) or not func.__code__.co_filename.startswith(REPO):
        return
    try:
        sig = inspect.signature(func)
        name, written = defaults_in(func.__code__.co_filename).get(func.__code__.co_firstlineno, (None, {}))
    except (TypeError, ValueError, OSError, SyntaxError):
        return
    if name != func.__name__:
        return
    func.__signature__ = sig.replace(parameters=[
        p.replace(default=Written(written[p.name])) if p.default is not p.empty and p.name in written else p
        for p in sig.parameters.values()])


def setup(app):
    app.connect("autodoc-before-process-signature", defaults_as_written)
    app.connect("autodoc-process-docstring", docstring_as_written)
    app.connect("doctree-resolved", link_figures_to_their_files)
