"""The course's website: `make site` builds it offline, and a real headless browser reads every page.

The build part runs wherever the site's requirements are installed (make test installs them).
The browser part drives Debian's chromium through its chromedriver (selenium); where no
Chromium is installed it skips with one line naming the command that installs it. The browser
is told no host resolves but 127.0.0.1, and its network log must show nothing else asked for.
It reads every page as a learner would at 1280 x 900 (no code cell, output or stub wider than
its column) and on a 390-px phone (no page scrolling sideways), and searches as one would (the
lesson that teaches the query first, the sentence that says it as the excerpt).
Screenshots go to runs/site/: the landing page, and each lesson at its first figure and its math.
"""
import html as html_module
import http.server
import json
import re
import shutil
import sys
import threading
import time
from functools import partial
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import nbformat
import numpy as np
import pytest

from tp_from_scratch.comm.launchers import run_command
from tp_from_scratch.plots import course_layout, direct_prerequisites, draw_course_map
from tp_from_scratch.tools.grading import EXERCISES
from website.build import api_modules_by_lesson, exercise_title, lesson_notebooks, lesson_of_exercise, project_pages
from website.build import main as build_main
from website.course import LESSONS
from website.references import CITATION, REFERENCES, address

REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "runs" / "site"
BUILD_TIMEOUT_S = 600   # about a minute on 2 quiet cores; a cold build took 446 s and passed 300 s
                        # twice beside make test-sized work (load 12-20 on 2 cores)
WAIT_S = 30             # any one page load, script or search in the browser
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
INSTALL_CHROMIUM = "apt-get install -y chromium chromium-driver"
# any test may be the one whose fixture builds the site (pytest -k): each gets the build's time and more
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 240)


# --- the course map's table --------------------------------------------------------------------

def test_every_notebook_has_its_line_in_the_course_map_and_every_line_its_notebook():
    in_table = [row[0] for row in LESSONS]
    assert sorted(in_table) == sorted(lesson_notebooks()), (
        f"website/course.py lists lessons {sorted(in_table)}, lessons/ holds {sorted(lesson_notebooks())}: "
        f"add one line per lesson to LESSONS")


def test_the_map_puts_each_lesson_below_every_lesson_it_builds_on_and_no_two_in_one_place():
    layout = course_layout([(number, builds_on) for number, _, _, builds_on in LESSONS])
    for number, _, _, builds_on in LESSONS:
        for prerequisite in builds_on:
            assert layout[prerequisite][1] < layout[number][1], (prerequisite, number, layout)
    assert len(set(layout.values())) == len(layout), layout


def test_the_map_draws_a_box_per_lesson_with_its_title_and_an_arrow_per_prerequisite():
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.patches import FancyBboxPatch

    fig, centre = draw_course_map(LESSONS)
    ax = fig.axes[0]
    texts = {t.get_text() for t in ax.texts}
    assert {f"{number}  {title}" for number, title, _, _ in LESSONS} | {t for _, _, t, _ in LESSONS} <= texts
    assert len([p for p in ax.patches if isinstance(p, FancyBboxPatch)]) == len(LESSONS)
    arrows = [(a.xyann, a.xy) for a in ax.texts if hasattr(a, "arrow_patch") and a.arrow_patch]
    direct = direct_prerequisites([(number, builds_on) for number, _, _, builds_on in LESSONS])
    assert len(arrows) == sum(len(builds_on) for builds_on in direct.values())
    boxes = [p.get_bbox() for p in ax.patches if isinstance(p, FancyBboxPatch)]
    for (x0, y0), (x1, y1) in arrows:  # each arrow runs down, from a box's bottom to a lower box's top,
        assert y1 < y0                 # and crosses no box on its way
        for s in np.linspace(0.02, 0.98, 200):
            x, y = x0 + s * (x1 - x0), y0 + s * (y1 - y0)
            assert not any(b.x0 < x < b.x1 and b.y0 < y < b.y1 for b in boxes), ((x0, y0), (x1, y1), (x, y))
    matplotlib.pyplot.close(fig)


def test_the_map_draws_each_prerequisite_not_reached_through_another():
    # 4 builds on 1 and 3, and 3 on 2 on 1: the arrow 1 -> 4 would cross 2 and 3
    assert direct_prerequisites([(1, ()), (2, (1,)), (3, (2,)), (4, (1, 3)), (5, (2, 4))]) == \
        {1: (), 2: (1,), 3: (2,), 4: (3,), 5: (4,)}
    direct = direct_prerequisites([(number, builds_on) for number, _, _, builds_on in LESSONS])
    assert all(set(direct[number]) <= set(builds_on) for number, _, _, builds_on in LESSONS)


def test_a_lesson_that_builds_on_one_not_yet_listed_is_refused():
    with pytest.raises(ValueError, match="lesson 2 builds on \\[3\\]"):
        course_layout([(1, ()), (2, (3,)), (3, (1,))])


# --- what the pages say: titles, API pages, references ------------------------------------------

def exercise_ids_of_lesson():
    """{lesson number: its exercise ids, in order}, from tools/grading.py's EXERCISES."""
    by_lesson = {}
    for exercise_id in EXERCISES:
        by_lesson.setdefault(lesson_of_exercise(exercise_id), []).append(exercise_id)
    return by_lesson


def test_every_lesson_title_names_the_exercises_of_the_lesson_and_no_other():
    ids = exercise_ids_of_lesson()
    for number, notebook in lesson_notebooks().items():
        title = nbformat.read(notebook, as_version=4).cells[0].source.splitlines()[0]
        named = f"({', '.join(ids[number])})" if number in ids else ""
        assert title.startswith(f"# Lesson {number}"), f"{notebook.name}: the title reads {title!r}"
        assert re.findall(r"\(ex\d+[a-z]?(?:, ex\d+[a-z]?)*\)", title) == ([named] if named else []), (
            f"{notebook.name}: the title reads {title!r}; it should name {named or 'no exercise'} "
            f"('# Lesson {number}{' ' + named if named else ''}: ...', lessons/src/{notebook.stem}.py)")


def test_an_exercise_title_is_the_docstrings_whole_first_paragraph(tmp_path):
    stub = tmp_path / "ex99_wrapped.py"
    stub.write_text('"""Exercise 99: a title wrapped\nover two lines (lessons/99_x.ipynb).\n\nMore text."""\n')
    assert exercise_title(stub) == "a title wrapped over two lines"


# A formula typed in ASCII in a lesson's prose (outside $...$, code and indented blocks): a root,
# a log2, a power or a subscript in braces, a sum_, a floor(, the ring's (t-1)/t, or a division by
# a parenthesised sum or product ("(p-1)/(m+p-1)", "C / (9·H·W)")
ASCII_FORMULA = re.compile(r"sqrt\(|\blog2\b|[A-Za-z0-9)]\^[A-Za-z0-9({]|_\{|\bsum_|\(t ?- ?1\) ?/ ?t\b|\bfloor\("
                           r"|[\w)] ?/ ?\((?=[^)]*[-+*·])")


def ascii_formulas(markdown):
    """The ASCII formulas in a markdown cell's prose: math, code spans and blocks removed first."""
    prose = re.sub(r"\$\$.*?\$\$|\$[^$]+\$|```.*?```|`[^`]*`", " ", markdown, flags=re.S)
    prose = re.sub(r"^    .*$", " ", prose, flags=re.M)
    return [m.group(0) for m in ASCII_FORMULA.finditer(prose)]


def test_ascii_formulas_are_found_and_math_code_and_shapes_are_not():
    assert ascii_formulas("sbh * 5a / (h + t) and (p-1)/(m+p-1)") == ["a / (", ")/("]
    assert ascii_formulas("sends 2(t-1)/t N, N log2 t, sqrt(512), 2^bits, z_{t-1}, k = floor(p·H)") == \
        ["(t-1)/t", "log2", "sqrt(", "2^b", "_{", "floor("]
    assert ascii_formulas("$2\\frac{t-1}{t}$, `sqrt(x)`, (B, T, H/t), F/t-wide, 1/t of it\n\n    x ** 2 / (a + b)") == []


def test_every_lesson_writes_its_formulas_in_mathjax_not_ascii():
    for number, notebook in lesson_notebooks().items():
        cells = nbformat.read(notebook, as_version=4).cells
        found = [f for cell in cells if cell.cell_type == "markdown" for f in ascii_formulas(cell.source)]
        assert not found, (f"Lesson {number} types formulas in ASCII: {found[:5]}; write them as $...$ "
                           f"(MathJax) in lessons/src/{notebook.stem}.py")


def test_every_lesson_has_an_api_page_and_every_module_one_place_in_the_api():
    by_lesson = api_modules_by_lesson()
    assert set(lesson_notebooks()) <= set(by_lesson), f"lessons without an API page: " \
        f"{sorted(set(lesson_notebooks()) - set(by_lesson))}"
    documented = [module for modules in by_lesson.values() for module in modules]
    assert len(documented) == len(set(documented)), "a module is documented on two API pages"
    assert by_lesson[4] == ["tp_from_scratch.layers.attention", "tp_from_scratch.layers.block"], by_lesson[4]


def test_api_signatures_show_each_default_as_the_source_writes_it():
    # website/conf.py's defaults_as_written, the hook autodoc calls before it prints a signature:
    # the name the source writes, not the value (a constant's number, a class's repr, a path of
    # this clone); the functions' signatures are restored for the rest of the session
    import inspect
    pytest.importorskip("sphinx", reason="the site's requirements: .venv/bin/pip install -r requirements-site.txt")
    from tp_from_scratch.comm.base import timeout_from_env
    from tp_from_scratch.layers.reference import init_mlp_params
    from website import conf
    for func, parameter, written in ((timeout_from_env, "default", "DEFAULT_TIMEOUT"),
                                     (init_mlp_params, "dtype", "np.float64")):
        assert repr(inspect.signature(func).parameters[parameter].default) != written
        try:
            conf.defaults_as_written(None, func, False)
            assert repr(inspect.signature(func).parameters[parameter].default) == written, func.__name__
        finally:
            func.__dict__.pop("__signature__", None)


def test_a_citation_in_the_text_is_linked_to_its_work():
    for text, url in [("Megatron-LM (Shoeybi et al. 2019) reported", "https://arxiv.org/abs/1909.08053"),
                      ("Korthikanti et al.'s formula", "https://arxiv.org/abs/2205.05198"),
                      ("*Tensor-Parallelism with Partially\nSynchronized Activations*", "https://arxiv.org/abs/2506.19645"),
                      ("its report (arXiv 2412.19437, §3.1)", "https://arxiv.org/abs/2412.19437")]:
        match = CITATION.search(text)
        assert match and address(match)[1] == url, (text, match)
    assert CITATION.search("Megatron-LM's code names") is None   # the software, not a paper


def test_the_build_refuses_an_out_folder_it_would_wipe_before_any_work(tmp_path, capsys):
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "mine.txt").write_text("not a site")
    for out in (REPO, keep, keep / "mine.txt"):
        with pytest.raises(SystemExit) as refused:
            build_main(["--out", str(out), "--work", str(tmp_path / "work")])
        assert refused.value.code != 0
        assert f"--out {out}" in capsys.readouterr().err
    assert (keep / "mine.txt").read_text() == "not a site" and not (tmp_path / "work").exists()


# --- the build ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(html folder, build log, seconds): one build for the whole file, as `make site` makes it."""
    pytest.importorskip("sphinx", reason="the site's requirements: .venv/bin/pip install -r requirements-site.txt")
    work = tmp_path_factory.mktemp("site")
    start = time.perf_counter()
    result = run_command([sys.executable, str(REPO / "website" / "build.py"), "--out", str(work / "html"),
                          "--work", str(work)], timeout=BUILD_TIMEOUT_S, cwd=str(REPO))
    seconds = time.perf_counter() - start
    assert result.returncode == 0, f"the site did not build:\n{result.stdout[-4000:]}"
    return work / "html", result.stdout, seconds


def test_the_site_builds_without_a_warning_and_has_a_page_per_lesson_doc_and_exercise(site):
    html, log, seconds = site
    print(f"site built in {seconds:.1f} s")
    assert not re.findall(r"^.*(?:WARNING|ERROR).*$", log, re.M), log[-4000:]
    expected = ["index.html", "search.html", "api/index.html", "api/verify.html"]
    expected += [f"lessons/{p.stem}.html" for p in lesson_notebooks().values()]
    expected += [f"docs/{p.stem}.html" for p in sorted((REPO / "docs").glob("*.md"))]
    expected += [f"{p.stem}.html" for p in project_pages()]
    expected += [f"exercises/{stem}.html" for stem, _ in EXERCISES.values()]
    missing = [page for page in expected if not (html / page).is_file()]
    assert not missing, f"pages missing from the site: {missing}"


def test_no_page_loads_anything_from_another_host(site):
    html, _, _ = site
    for page in html.rglob("*.html"):
        text = page.read_text()
        remote = re.findall(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//[^\"]*\"", text)
        assert not remote, f"{page.relative_to(html)} loads from another host: {remote[:3]}"
    assert (html / "_static" / "mathjax" / "tex-chtml.js").is_file(), "MathJax is not in the site"


def test_each_lesson_page_links_its_exercises_and_the_commands_that_grade_them(site):
    html, _, _ = site
    notebooks = lesson_notebooks()
    for exercise_id, (stem, _) in EXERCISES.items():
        page = (html / "lessons" / f"{notebooks[lesson_of_exercise(exercise_id)].stem}.html").read_text()
        assert f'href="../exercises/{stem}.html"' in page, f"{exercise_id}: no link from its lesson"
        shown = text_of(page)
        assert f"make grade EX={exercise_id}" in shown and f"exercises/test_{stem}.py" in shown, exercise_id
        exercise = text_of((html / "exercises" / f"{stem}.html").read_text())
        assert "NotImplementedError" in exercise, f"{stem}: the stub is not shown on its page"


def text_of(page):
    """What a reader sees of an HTML page, tags (and so the highlighter's spans) removed."""
    return html_module.unescape(re.sub(r"<[^>]+>", "", page))


def test_the_landing_page_is_the_readme_with_the_course_map(site):
    html, _, _ = site
    landing = (html / "index.html").read_text()
    assert "course_map.svg" in landing
    first_section = re.search(r"^## (.+)$", (REPO / "README.md").read_text(), re.M).group(1)
    assert first_section.split("(")[0].strip() in landing, f"README's '{first_section}' is not on the landing page"


def test_each_exercise_page_carries_its_whole_title(site):
    html, _, _ = site
    landing = (html / "index.html").read_text()
    for exercise_id, (stem, _) in EXERCISES.items():
        page = (html / "exercises" / f"{stem}.html").read_text()
        whole = f"Exercise {exercise_id}: {exercise_title(REPO / 'exercises' / f'{stem}.py')}"
        title = html_module.unescape(re.search(r"<title>(.*?)</title>", page, re.S).group(1))
        heading = text_of(re.search(r"<h1>(.*?)</h1>", page, re.S).group(1))
        assert title.startswith(whole + " "), (title, whole)
        assert heading.startswith(whole), (heading, whole)
        # and in the navigation every page carries (the landing page's, as every other page's)
        in_navigation = re.findall(rf'href="exercises/{stem}\.html"[^>]*>(.*?)</a>', landing, re.S)
        assert in_navigation and all(text_of(t).strip() == whole for t in in_navigation), (in_navigation, whole)


def test_each_lesson_has_its_api_page(site):
    html, _, _ = site
    for number, title, _, _ in LESSONS:
        page = html / "api" / f"lesson_{number:02d}.html"
        assert page.is_file(), f"no API page for Lesson {number}"
        assert f"API of Lesson {number}: {title}" in text_of(page.read_text())


def test_every_cited_work_is_linked_where_a_page_cites_it(site):
    """Each work of website/references.py that a page's prose cites is a link on that page (an
    address, not a request: the browser check below still sees nothing asked of another host)."""
    html, _, _ = site
    cited = 0
    for page in html.rglob("*.html"):
        text = page.read_text()
        prose = text_of(re.sub(r"<(pre|code)\b.*?</\1>", " ", text, flags=re.S))
        for match in CITATION.finditer(prose):
            _, url = address(match)
            assert f'href="{url}"' in text, f"{page.relative_to(html)} cites {match.group(0)!r} without a link to {url}"
            cited += 1
    assert cited >= len(REFERENCES), f"only {cited} citations found in the whole site"


# --- the browser -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(site):
    """The built site over HTTP on 127.0.0.1, on a port the OS picks."""
    html, _, _ = site
    handler = partial(QuietHandler, directory=str(html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", html
    httpd.shutdown()
    thread.join(timeout=10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip(f"no Chromium for the browser check: {INSTALL_CHROMIUM}")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                 # Chromium phones home (updates, accounts) whatever else it is told: resolve nothing else
                 "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(WAIT_S)
    driver.set_script_timeout(WAIT_S)
    yield driver
    driver.quit()


MATHJAX_DONE = """
const done = arguments[arguments.length - 1];
if (!window.MathJax || !MathJax.startup || !MathJax.startup.promise) { done("no MathJax"); return; }
MathJax.startup.promise.then(() => done("typeset"), (e) => done("failed: " + e));
"""

PAGE_FACTS = """
const prose = [...document.querySelectorAll("p, li, td, h1, h2, h3")]
  .filter((e) => !e.closest("pre, code, .highlight, .cell_output, mjx-container"));
return {
  math: document.querySelectorAll("article .math").length,
  typeset: document.querySelectorAll("article mjx-container").length,
  raw_dollars: prose.map((e) => e.innerText).filter((t) => /\\$[^$\\s][^$]*\\$/.test(t)).slice(0, 3),
  images: [...document.images].map((i) => [i.getAttribute("src"), i.complete && i.naturalWidth > 0]),
  links: [...document.querySelectorAll("a[href]")].map((a) => a.getAttribute("href")),
  code: document.querySelectorAll("div.highlight pre").length,
  figures: document.querySelectorAll(".cell_output img").length,
  copy_buttons: document.querySelectorAll("button.copybtn").length,
  // a figure of a cell's output that is not a link to its own file cannot be opened full size
  unlinked_figures: [...document.querySelectorAll(".cell_output img")]
    .filter((i) => !(i.closest("a[href]") && i.closest("a[href]").href === i.src)).map((i) => i.getAttribute("src")),
};
"""

# Code cells, outputs and the stubs: wider than the box that shows them (their end hidden behind a
# scroll bar), or than the article's column. Each entry: the block's first line.
CLIPPED_CODE = """
const article = document.querySelector("article.bd-article");
if (!article) return [];
const right = article.getBoundingClientRect().right;
return [...article.querySelectorAll("pre")]
  .filter((p) => p.scrollWidth > p.clientWidth + 1 || p.getBoundingClientRect().right > right + 1)
  .map((p) => p.textContent.trim().split("\\n")[0].slice(0, 60));
"""

# A 390-px-wide viewport: the width a phone lays the page out at (its viewport meta says
# width=device-width). Chrome's full mobile emulation finds the same and takes twice as long.
PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": False}
# how far the page scrolls sideways (0: it does not), and where it does, what sticks out
SIDEWAYS = """
const width = document.documentElement.clientWidth;
const sideways = document.documentElement.scrollWidth - width;
if (sideways <= 0) return [sideways, []];
const out = [...document.querySelectorAll("body *")]
  .filter((e) => e.getBoundingClientRect().right > width + 1 && !e.closest("pre, .pst-scrollable-table-container,"
    + " mjx-container, table.indextable, .highlight, .cell_output, dialog") && e.offsetParent !== null)
  .map((e) => e.tagName.toLowerCase() + "." + [...e.classList].join(".") + ": " + (e.textContent || "").trim().slice(0, 40));
return [sideways, out.slice(-3)];
"""


def lay_out_as_phone(driver, phone):
    """Lay pages out at the phone's width (True) or back at the window's 1280 px; returns ``phone``."""
    if phone:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
    else:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return phone


def sideways_problems(driver, page):
    """[] if the page, laid out at a phone's width, does not scroll sideways; else what sticks out."""
    sideways, sticking_out = driver.execute_script(SIDEWAYS)
    return [f"{page}: scrolls {sideways} px sideways on a 390-px phone: {sticking_out}"] if sideways > 0 else []


def stub_problems_on_a_phone(driver, page):
    """[] unless an exercise page, laid out at a phone's width, hides the end of a line of its stub
    (the instructions a learner reads there) behind the stub's own scroll bar."""
    if not page.startswith("exercises/"):
        return []
    clipped = driver.execute_script(CLIPPED_CODE.replace('querySelectorAll("pre")', 'querySelectorAll(".exercise-stub pre")'))
    stubs = driver.execute_script('return document.querySelectorAll("article.bd-article .exercise-stub pre").length')
    if not stubs:
        return [f"{page}: no stub (.exercise-stub) on the page"]
    return [f"{page}: its stub scrolls sideways on a 390-px phone: {clipped[0]!r}"] if clipped else []


def sideways_on_a_phone(driver):
    """(pixels the page scrolls sideways on a 390-px phone, what sticks out), the page as loaded."""
    lay_out_as_phone(driver, True)
    try:
        return driver.execute_script(SIDEWAYS)
    finally:
        lay_out_as_phone(driver, False)


def scroll_to(driver, selector):
    driver.execute_script("const e = document.querySelector(arguments[0]); if (e) e.scrollIntoView({block: 'center'});",
                          selector)


def requested_urls(driver):
    """Every URL the browser asked for since the last call (Chrome's performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def ids_of(page, cache={}):  # noqa: B006 - a cache for this module's link check
    if page not in cache:
        cache[page] = set(re.findall(r'\bid="([^"]+)"', page.read_text()))
    return cache[page]


def broken_internal_links(base, html, url, links):
    """The links of the page at ``url`` that point into the site at a missing file or anchor."""
    broken = []
    for link in links:
        target = urlparse(urljoin(url, link))
        if target.scheme not in ("http", "https") or target.netloc != urlparse(base).netloc:
            continue  # mailto:, a paper's address: not the site's
        path = html / unquote(target.path).lstrip("/")
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file() or (target.fragment and path.suffix == ".html"
                                  and unquote(target.fragment) not in ids_of(path)):
            broken.append(link)
    return broken


def site_pages(html):
    """The site's pages: every .html but those under _static/ (the theme ships template fragments there)."""
    return sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")
                  if not p.relative_to(html).parts[0].startswith("_"))


def test_every_page_loads_clean_offline_with_its_figures_math_and_links(browser, site, server):
    """Each page, as a reader gets it: no console error, nothing asked of another host, every image
    loaded and a link to its own file, the math typeset (no $...$ left raw; every lesson has
    some), every link into the site resolving, down to its anchor, and a copy button on each code
    block of a lesson. At 1280 px no code cell, output or stub of a lesson or exercise page is
    wider than its box or the column; on a 390-px phone no page scrolls sideways, and an
    exercise's stub (its instructions) wraps rather than scrolling inside its box."""
    base, html = server
    pages = site_pages(html)
    requested_urls(browser)  # drop what the browser did before the first page
    problems, shots, clipped = [], {}, {}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    phone = lay_out_as_phone(browser, False)   # the width the browser lays pages out at now
    for page in pages:
        url = urljoin(base, page)
        browser.get(url)
        facts = browser.execute_script(PAGE_FACTS)
        if facts["math"]:
            status = browser.execute_async_script(MATHJAX_DONE)
            facts = browser.execute_script(PAGE_FACTS)
            if status != "typeset" or facts["typeset"] < facts["math"]:
                problems.append(f"{page}: math not typeset ({status}, {facts['typeset']} of {facts['math']})")
        if facts["raw_dollars"]:
            problems.append(f"{page}: raw $...$ left: {facts['raw_dollars']}")
        if page.startswith("lessons/") and not facts["typeset"]:
            problems.append(f"{page}: no formula typeset: write the lesson's formulas as $...$ (MathJax)")
        if page.startswith("lessons/") and not 0 < facts["code"] <= facts["copy_buttons"]:
            problems.append(f"{page}: {facts['copy_buttons']} copy buttons for {facts['code']} code blocks")
        problems += [f"{page}: figure not a link to its file: {src}" for src in facts["unlinked_figures"]]
        unloaded = [src for src, loaded in facts["images"] if not loaded]
        if unloaded:  # a lazy image loads once on screen
            for src in unloaded:
                scroll_to(browser, f'img[src="{src}"]')
            time.sleep(0.5)
            unloaded = [src for src, loaded in browser.execute_script(PAGE_FACTS)["images"] if not loaded]
            problems += [f"{page}: image not loaded: {src}" for src in unloaded]
        problems += [f"{page}: broken link {link}" for link in broken_internal_links(base, html, url, facts["links"])]
        errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        problems += [f"{page}: console error: {message}" for message in errors]
        outside = [u for u in requested_urls(browser) if not u.startswith((base, "data:", "blob:"))]
        problems += [f"{page}: requested outside 127.0.0.1: {u}" for u in outside]
        # The two widths. Switching re-lays the whole page out, the costly part, and the width
        # carries over to the next page: so a page is read at the width it loaded at first, and
        # only a page with something to check at 1280 px switches at all, once.
        read_on_phone = phone
        if phone:
            problems += sideways_problems(browser, page) + stub_problems_on_a_phone(browser, page)
        if page == "index.html" or page.startswith(("lessons/", "exercises/")):
            if phone:
                phone = lay_out_as_phone(browser, False)
            clipped[page] = browser.execute_script(CLIPPED_CODE)
            if page == "index.html" or page.startswith("lessons/"):
                shots[page] = screenshot_figure_and_math(browser, page), facts["math"] > 0, facts["figures"] > 0
        if not read_on_phone:
            phone = lay_out_as_phone(browser, True)
            problems += sideways_problems(browser, page) + stub_problems_on_a_phone(browser, page)
    lay_out_as_phone(browser, False)
    problems += [f"{page}: {len(blocks)} code blocks wider than the column at 1280 px, first: {blocks[0]!r}"
                 for page, blocks in clipped.items() if blocks]
    print(f"code blocks clipped at 1280 px: {sum(map(len, clipped.values()))} on {len(clipped)} pages")
    assert not problems, "\n".join(problems[:40])
    for page, (files, has_math, has_figure) in shots.items():  # a shot of each the lesson has
        kinds = {Path(f).stem.rsplit("_", 1)[-1] for f in files}
        expected = {kind for kind, has in (("figure", has_figure), ("math", has_math)) if has}
        assert page == "index.html" or kinds == expected, (page, files)


def screenshot_figure_and_math(driver, page):
    """runs/site/index.png (the landing page at its course map); for a lesson, <lesson>_figure.png centred on its
    first figure and <lesson>_math.png on its first displayed equation (or inline math, if it has none)."""
    name = page.removesuffix(".html").replace("/", "_")
    if not page.startswith("lessons/"):
        scroll_to(driver, 'img[src*="course_map"]')
        driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
        return [str(SCREENSHOTS / f"{name}.png")]
    files = []
    for what, selector in (("figure", ".cell_output img"), ("math", "article mjx-container[display='true']"),
                           ("math", "article mjx-container")):
        if what in (f.stem.rsplit("_", 1)[-1] for f in files):
            continue
        if driver.execute_script("return document.querySelector(arguments[0]) !== null", selector):
            scroll_to(driver, selector)
            files.append(SCREENSHOTS / f"{name}_{what}.png")
            driver.save_screenshot(str(files[-1]))
    return [str(f) for f in files]


SEARCH_RESULTS = """
return [...document.querySelectorAll("#search-results ul.search li")].map((li) => {
  const link = li.querySelector("a"), excerpt = li.querySelector("p.context");
  return [link.getAttribute("href"), link.textContent, excerpt ? excerpt.textContent : null];
});
"""


def article_text(page):
    """The words of a page's article as a reader sees them, the math's TeX without its delimiters."""
    article = re.search(r'<article class="bd-article">(.*?)</article>', page.read_text(), re.S).group(1)
    return " ".join(text_of(article).replace("\\(", "").replace("\\)", "").split())


@pytest.mark.parametrize("query, lesson", [("all-reduce", "02_collectives"),
                                           ("sequence parallelism", "07_sequence_parallelism")])
def test_the_site_search_finds_the_lesson_that_teaches_it_first_with_the_sentence_that_says_it(
        browser, site, server, query, lesson):
    """The search page as a learner uses it: the lesson that teaches the query comes first (a
    hyphenated term is one word), its excerpt is the sentence of the lesson that holds the query
    (not the theme's buttons or the table of contents), and on a phone the results fit the screen."""
    from selenium.webdriver.support.ui import WebDriverWait

    base, html = server
    browser.get(urljoin(base, f"search.html?q={query}"))
    results = WebDriverWait(browser, WAIT_S).until(
        lambda d: (found := d.execute_script(SEARCH_RESULTS)) and found[0][2] is not None and found)
    href, title, excerpt = results[0]
    assert href.startswith(f"lessons/{lesson}.html"), f"{query!r}: first hit {title!r}; then {[r[1] for r in results[1:6]]}"
    sentence = " ".join(excerpt.strip(".").split())
    assert query in sentence.lower(), f"{query!r}: the excerpt {excerpt!r} does not hold the query"
    assert sentence in article_text(html / "lessons" / f"{lesson}.html"), f"{query!r}: {excerpt!r} is not the lesson's text"
    sideways, sticking_out = sideways_on_a_phone(browser)
    assert sideways <= 0, f"the search results scroll {sideways} px sideways on a phone: {sticking_out}"


def test_the_site_search_finds_reduce_scatter(browser, site, server):
    from selenium.webdriver.support.ui import WebDriverWait

    base, _ = server
    browser.get(urljoin(base, "search.html?q=reduce-scatter"))
    results = WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_elements("css selector", "#search-results ul.search li"))
    titles = [r.text for r in results]
    assert any("Sequence" in t or "sequence" in t for t in titles), titles[:10]
