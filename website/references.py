"""The works the course cites, each with its address, and the Sphinx extension that links them.

The lessons, docs and docstrings cite a paper as prose ("Korthikanti et al. (2022, ...)",
"Rajbhandari et al. (2020)", "arXiv 2412.19437"); the build turns the first such citation in
each section into a link to the paper, so the sources are one click away and their addresses
are written once, here. A link is not a request: the site still loads nothing from another host.
"""
import re

from docutils import nodes

# (the citation as the course's text writes it: a regular expression; the work; its address)
REFERENCES = [
    (r"Shoeybi et al\.,? 2019|Megatron 2019",
     "Shoeybi et al. 2019, Megatron-LM: Training Multi-Billion Parameter Language Models Using Model "
     "Parallelism", "https://arxiv.org/abs/1909.08053"),
    (r"Korthikanti(?: et al\.)?",
     "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models",
     "https://arxiv.org/abs/2205.05198"),
    (r"Rajbhandari et al\.",
     "Rajbhandari et al. 2020, ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
     "https://arxiv.org/abs/1910.02054"),
    (r"Li et al\. 2020",
     "Li et al. 2020, PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
     "https://arxiv.org/abs/2006.15704"),
    (r"Wang et al\. 2022",
     "Wang et al., Overlap Communication with Dependent Computation via Decomposition in Large Deep "
     "Learning Models (ASPLOS 2023)", "https://doi.org/10.1145/3567955.3567959"),
    (r"Patarasuk & Yuan",
     "Patarasuk and Yuan 2009, Bandwidth optimal all-reduce algorithms for clusters of workstations",
     "https://doi.org/10.1016/j.jpdc.2008.09.002"),
    (r"Tensor-Parallelism with Partially Synchronized Activations",
     "Tensor-Parallelism with Partially Synchronized Activations (CAAT-Net, 2025)",
     "https://arxiv.org/abs/2506.19645"),
    (r"arXiv:?\s?(?P<arxiv>\d{4}\.\d{4,5})", "arXiv {arxiv}", "https://arxiv.org/abs/{arxiv}"),
]
# a line break in the source is a space in the text: "Partially\nSynchronized" matches
CITATION = re.compile("|".join("(?P<r%d>%s)" % (i, pattern.replace(" ", r"\s+"))
                               for i, (pattern, _, _) in enumerate(REFERENCES)))

NOT_PROSE = (nodes.literal, nodes.literal_block, nodes.reference, nodes.title, nodes.math,
             nodes.math_block, nodes.raw, nodes.comment)


def address(match):
    """(the work, its address) of a CITATION match."""
    number = next(int(name[1:]) for name, value in match.groupdict().items() if value and name[0] == "r"
                  and name[1:].isdigit())
    _, work, url = REFERENCES[number]
    fields = {k: v for k, v in match.groupdict().items() if not (k[0] == "r" and k[1:].isdigit())}
    return work.format(**fields), url.format(**fields)


def in_prose(node):
    parent = node.parent
    while parent is not None:
        if isinstance(parent, NOT_PROSE) or "cell_output" in parent.get("classes", []):
            return False
        parent = parent.parent
    return True


def section_of(node):
    while node is not None and not isinstance(node, (nodes.section, nodes.document)):
        node = node.parent
    return node


def link_citations(app, doctree):
    """doctree-read: the first citation of each work in each section becomes a link to it."""
    linked = set()
    # a title in italics may span lines, which the parser keeps as separate text nodes: link it whole
    for inline in list(doctree.findall(lambda n: isinstance(n, (nodes.emphasis, nodes.strong)))):
        match = CITATION.fullmatch(" ".join(inline.astext().split()))
        if match and in_prose(inline) and (key := (id(section_of(inline)), address(match)[1])) not in linked:
            linked.add(key)
            work, url = address(match)
            link = nodes.reference("", "", refuri=url, reftitle=work)
            inline.replace_self(link)
            link.append(inline)
    # MyST keeps each source line (a soft break) as a Text node of its own: join neighbours, so a
    # citation the source breaks across lines ("arXiv\n2501.06589") is one text to match
    for element in list(doctree.findall(nodes.Element)):
        at = 0
        while at < len(element.children) - 1:
            first, second = element.children[at], element.children[at + 1]
            if isinstance(first, nodes.Text) and isinstance(second, nodes.Text):
                element.remove(second)
                element.replace(first, nodes.Text(first.astext() + second.astext()))
            else:
                at += 1
    for text in list(doctree.findall(nodes.Text)):
        if not in_prose(text) or not CITATION.search(text.astext()):
            continue
        source, pieces, at = text.astext(), [], 0
        for match in CITATION.finditer(source):
            work, url = address(match)
            key = (id(section_of(text)), url)
            if key in linked:
                continue
            linked.add(key)
            pieces += [nodes.Text(source[at:match.start()]),
                       nodes.reference(match.group(0), match.group(0), refuri=url, reftitle=work)]
            at = match.end()
        if pieces:
            text.parent.replace(text, [*pieces, nodes.Text(source[at:])])


def setup(app):
    app.connect("doctree-read", link_citations)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
