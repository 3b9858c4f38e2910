"""The words the report uses, each defined once, and the link from each one's first use in a section
to its definition.

TERMS is the report's glossary ("Words used here", templates/glossary.html.j2): an anchor, the words
shown, the definition and the pattern that finds the term in the report's text. `link_first_uses`
rewrites a rendered page so that in each <section> the first use of each term links to
`#term-<anchor>` (Chromium opens the folded glossary on following it); later uses stay plain, so
that the text reads as text. What is not prose is left alone: headings and the user's titles, code
and ids, plots, table headers and captions, summaries, links, and the glossary itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from markupsafe import Markup

from ..core.ceilings import KNEE_REACHES


@dataclass(frozen=True)
class Term:
    anchor: str  # the definition's id is term-<anchor>
    words: str  # as the glossary lists it
    definition: Markup
    # finds a use in the text, case-insensitive; plain enough for a browser's RegExp too
    pattern: str


TERMS = [
    Term(
        "cell",
        "cell",
        Markup(
            "one configuration of knobs, run as many times as the config's repeats; its id is "
            "its knobs, its label the knobs that vary between its experiment's cells."
        ),
        r"\bcells?\b",
    ),
    Term(
        "baseline",
        "baseline",
        Markup(
            "the cell that takes the first level of every matrix axis: what the others "
            "are compared with."
        ),
        r"\bbaselines?\b",
    ),
    Term(
        "stall",
        "waits for data (stall %)",
        Markup("the share of each training step spent waiting for the next batch from the loader."),
        r"\bwait(?:s|ing)? (?:for|on) (?:data|the loader)\b|\bstall\b",
    ),
    Term(
        "bound",
        "bound",
        Markup(
            "what limits a training cell: <b>data</b> (it waits for the loader 10 % of each step "
            "or more), <b>transfer</b> (the host-to-device copy), or <b>compute</b> (the model "
            "itself)."
        ),
        r"\b(?:data|compute|transfer)-bound\b|(?<![-\w])bound\b",  # not a CPU-bound worker
    ),
    Term(
        "ceiling",
        "ceiling",
        Markup(
            "the most one part can do alone: the loader without a model, the model with its data "
            "already on the device, the copy. A training cell is predicted from its ceilings."
        ),
        r"\bceilings?\b",
    ),
    Term(
        "free-data",
        "with free data, could run N x faster",
        Markup(
            "the compute ceiling over the measured throughput: how much faster training would be "
            "if loading cost nothing."
        ),
        r"\bwith free data\b",
    ),
    Term(
        "interval",
        "95 % interval",
        Markup(
            "where the mean throughput lies, from the repeats; a gain is clear when the two "
            "cells' intervals do not overlap."
        ),
        r"\b95 % (?:t-)?interval",
    ),
    Term(
        "what-if",
        "stage what-if",
        Markup(
            "a loader stage that costs nothing, is cached after, or runs on the device: "
            "predicted from the stage timings, measured when a matrix axis of "
            "<code>skip_stages</code>, <code>cache_after</code> or <code>device_stages</code> "
            "runs it."
        ),
        r"\bwhat-ifs?\b",
    ),
    Term(
        "knee",
        "knee",
        Markup(
            f"the fewest loader workers whose throughput reaches {100 * KNEE_REACHES:.0f} % of "
            "the best: more workers than that cost cores and memory for little."
        ),
        r"\bknee\b",
    ),
    Term(
        "oversubscribed",
        "oversubscribed",
        Markup(
            "the cell's loader workers and trainer ask for more CPU cores than it may use, and "
            "the workers are busy or use enough CPU to take the trainer's cores, so they wait "
            "for each other."
        ),
        r"\boversubscri\w*",
    ),
    Term(
        "measured",
        "measured, predicted",
        Markup(
            "measured: a figure the cells ran; predicted: computed from the ceilings or "
            "stage timings, never run."
        ),
        r"\b(?:measured|predicted)\b",
    ),
]
FOUND = re.compile(
    "|".join(f"(?P<t{i}>{term.pattern})" for i, term in enumerate(TERMS)), re.IGNORECASE
)
# Not prose: a term there is not linked (and a link inside a link, a heading or a summary would not
# work).
SKIPPED = {
    "a",
    "caption",
    "code",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "svg",
    "style",
    "script",
    "summary",
    "th",
    "dt",
    "title",
}
VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}
# A tag, a comment or a declaration of the page as the report's templates write it (attribute values
# escaped, so no `>` inside a tag); the text between them is what may be linked. The page's bytes
# are otherwise kept as they are.
MARKUP = re.compile(r"<!--.*?-->|<![^>]*>|<(/?)([A-Za-z][\w:-]*)([^>]*)>", re.DOTALL)


def link_first_uses(html: str) -> str:
    """The page with the first use of each term in each section linked to its definition (see the
    module docstring)."""
    out, open_tags, at = [], [], 0
    # the depth of the glossary while inside it; the terms linked in this section
    glossary, seen = None, None

    def link(match: re.Match) -> str:
        term = TERMS[int(match.lastgroup[1:])]
        if term.anchor in seen:
            return match.group()
        seen.add(term.anchor)
        return f'<a class="term" href="#term-{term.anchor}">{match.group()}</a>'

    for tag in MARKUP.finditer(html):
        text = html[at : tag.start()]
        prose = seen is not None and glossary is None and not SKIPPED & set(open_tags)
        out += [FOUND.sub(link, text) if prose else text, tag.group()]
        at = tag.end()
        closing, name, attrs = tag.group(1), (tag.group(2) or "").lower(), tag.group(3) or ""
        if not name or name in VOID or attrs.endswith("/"):
            continue
        if not closing:
            open_tags.append(name)
            seen = set() if name == "section" else seen
            glossary = (
                len(open_tags)
                if glossary is None and re.search(r'\bid="glossary"', attrs)
                else glossary
            )
        elif name in open_tags:
            while open_tags.pop() != name:
                pass
            glossary = None if glossary is not None and len(open_tags) < glossary else glossary
            seen = None if name == "section" else seen
    return "".join(out) + html[at:]
