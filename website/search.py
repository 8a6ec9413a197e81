"""The site's search, tuned for a course (a Sphinx extension; conf.py loads it).

Sphinx's own search (searchindex.js + searchtools.js, all in the browser) splits "all-reduce"
at the hyphen and drops "all" as a stop word, gives every page holding a word the same score,
and cuts its excerpt from the first match in the page's chrome (the theme switch, the table of
contents). Three changes, each with a Python half here and a JavaScript half in
_static/course_search.js:

* the words: a hyphenated word is one term as well as its parts, so "all-reduce" finds pages
  that say all-reduce and "reduce" still finds them (``CourseEnglish``, the index's language,
  and its ``splitQuery`` for the browser);
* the ranking: ``_static/course_search_data.js`` holds, per page, how often each term occurs in
  its prose (code and outputs left out), its title, its section headings and, for a lesson,
  what the course map (website/course.py) says it teaches. The browser scores a page with
  BM25 on those counts, plus a bonus where the whole query is a phrase of the course map's
  line, the title or a heading: the lesson that teaches a thing comes first;
* the excerpt: the sentence of the page's article that holds the query, not page chrome.
"""
import functools
import json
import re
from collections import Counter
from pathlib import Path

import snowballstemmer
from docutils import nodes
from sphinx.search.en import SearchEnglish

from website.course import LESSONS

DATA_FILE = "course_search_data.js"
# a run of word characters, optionally joined by hyphens: "all-reduce", "reduce-scatter", "x"
COMPOUND = re.compile(r"\w+(?:-\w+)*")


_ENGLISH = snowballstemmer.stemmer("english")   # SearchEnglish's own (sphinx/search/en.py)


@functools.cache
def english_stem(word):
    """SearchEnglish.stem, one stem per word for the whole build: Sphinx's index and page_facts
    each memoised per page, and the same words recur on every page (~70,000 stems computed)."""
    return _ENGLISH.stemWord(word.lower())


class CourseEnglish(SearchEnglish):
    """English as Sphinx indexes it, but a hyphenated word is kept whole as well as split."""

    # The browser's query splitter: a hyphenated word stays one term (its parts are in the
    # index too, so either spelling of a query finds the page). Mirrors words() below.
    js_splitter_code = (
        "var splitQuery = (query) => "
        "query.match(/[\\p{Letter}\\p{Number}_]+(?:-[\\p{Letter}\\p{Number}_]+)*/gu) || [];"
    )

    def stem(self, word):
        return english_stem(word)

    def split(self, input):
        found = []
        for word in COMPOUND.findall(input):
            found.append(word)
            if "-" in word:
                found += word.split("-")
        return found


def words(text):
    """The words of ``text`` in order, a hyphenated word kept whole (as the browser splits a query)."""
    return COMPOUND.findall(text)


NOT_PROSE = (nodes.literal_block, nodes.math, nodes.math_block, nodes.raw, nodes.comment, nodes.title)


def prose_texts(node):
    """The text nodes of prose under ``node``: not code, a cell's output, math, raw HTML or a title."""
    if isinstance(node, nodes.Text):
        yield node
    elif isinstance(node, nodes.Element) and not (isinstance(node, NOT_PROSE) or "cell_output" in node["classes"]):
        for child in node.children:
            yield from prose_texts(child)


def teaches(docname):
    """What the course map says a lesson page teaches ('' for any other page)."""
    name = docname.rpartition("/")[2]
    if not (docname.startswith("lessons/") and name[:2].isdigit()):
        return ""
    return next((f"{title} {what}" for number, title, what, _ in LESSONS if number == int(name[:2])), "")


def page_facts(doctree, docname, lang):
    """What the browser ranks a page by: prose term counts, the title's, headings' and course map's stems."""
    stem = lang.stem   # cached for the whole build (english_stem), lower case

    def stems(text):
        return [stem(w) for w in words(text)]

    counts = Counter()
    for text in prose_texts(doctree):
        counts.update(s for w in lang.split(text.astext()) if lang.word_filter(s := stem(w)))
    titles = [t.astext() for t in doctree.findall(nodes.title)]
    return {"length": sum(counts.values()), "counts": dict(counts),
            "title": stems(titles[0]) if titles else [], "headings": [stems(t) for t in titles[1:]],
            "teaches": stems(teaches(docname))}


def collect(app, doctree):
    """doctree-read: remember the page's facts in the environment (pickled, so a rebuild keeps them)."""
    if not hasattr(app.env, "course_search"):
        app.env.course_search = {}
    app.env.course_search[app.env.docname] = page_facts(doctree, app.env.docname, CourseEnglish({}))


def purge(app, env, docname):
    getattr(env, "course_search", {}).pop(docname, None)


def merge(app, env, docnames, other):
    env.course_search = {**getattr(env, "course_search", {}),
                         **{d: other.course_search[d] for d in docnames if d in getattr(other, "course_search", {})}}


def add_data_to_search_page(app, pagename, templatename, context, doctree):
    if pagename == "search":
        app.add_js_file(DATA_FILE)
        app.add_js_file("course_search.js")


def write_data(app, exception):
    """build-finished: _static/course_search_data.js, one entry per page of this build."""
    if exception is not None or app.builder.format != "html":
        return
    facts = getattr(app.env, "course_search", {})
    data = {docname: facts[docname] for docname in sorted(app.env.all_docs) if docname in facts}
    target = Path(app.outdir) / "_static" / DATA_FILE
    target.write_text("const COURSE_SEARCH = " + json.dumps(data, separators=(",", ":"), sort_keys=True) + ";\n")


def setup(app):
    app.add_search_language(CourseEnglish)
    app.connect("doctree-read", collect)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    app.connect("html-page-context", add_data_to_search_page)
    app.connect("build-finished", write_data)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
