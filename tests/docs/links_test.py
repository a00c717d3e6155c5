#!/usr/bin/python3
"""Every document the repository cites exists, and so does every section it cites.

links_test.py [REPO]: checks the tree at REPO (default: this checkout).

- A markdown link `[text](target)` in a *.md file resolves to a file or
  directory, relative to the file; `#anchor` (alone or after a *.md target)
  names a heading of that document, by GitHub's rule for heading anchors.
  Links to other sites (http:, https:, mailto:) are not followed.
- A `something.md` mentioned anywhere else (source comments, scripts, build
  files, and the prose of *.md files) exists: a path is taken from the
  repository's root or from the mentioning file's directory; a bare name may
  be anywhere in the tree.
- A citation of a section, `docs/design.md, "The lease path"` or
  `docs/design.md ("Protocol")`, names a heading of that document.

Build directories (build*/), .git and node_modules are not part of the tree,
nor is this file, whose own trees name documents that do not exist: the first
class checks the checker on them.
"""

import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

# Placeholders that name a kind of file, not one (bench/common.sh).
PLACEHOLDERS = {"NAME.md", "NAME-quick.md"}

SELF = os.path.join("tests", "docs", "links_test.py")
SKIP_DIRS = {".git", "node_modules", "corpus", "__pycache__"}
TEXT_SUFFIXES = (".md", ".h", ".c", ".cpp", ".py", ".sh", ".cmake", ".txt", ".lua",
                 ".toml", ".in", ".service", ".socket", ".sysusers", ".js", ".json")
TEXT_NAMES = {"Makefile", "run", "soak", "postinst", "prerm", "postrm", "triggers"}

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
MENTION = re.compile(r"(?<![\w$%{.\-/])((?:[\w.\-]+/)*[A-Za-z][\w\-]*\.md)\b")
# A section cited right after a mention: `X.md, "Title"` or `X.md ("Title"`,
# possibly across a comment's line break, and `"A" and "B"` for two.
SECTION = re.compile(r'\A(?:,|\s*\()[\s#/*]*"([^"]+)"(?:[\s#/*]*and[\s#/*]*"([^"]+)")?')
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path):
    """The set of anchors of a markdown file's headings (duplicates get -1, -2...)."""
    anchors, seen, fenced = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                anchors.add(base if n == 0 else "%s-%d" % (base, n))
    return anchors


def heading_titles(path):
    """The headings' own text, for citations by title."""
    titles, fenced = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                titles.add(m.group(1).strip())
    return titles


def strip_code(markdown):
    """The markdown without fenced blocks and inline code, line numbers kept."""
    out, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
        elif fenced:
            out.append("")
        else:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def tree_files(root):
    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        dirs[:] = sorted(d for d in dirs
                         if d not in SKIP_DIRS and not (rel_top == "." and d.startswith("build")))
        for name in sorted(files):
            yield os.path.join(top, name)


def is_text(path):
    name = os.path.basename(path)
    return name.endswith(TEXT_SUFFIXES) or name in TEXT_NAMES


def check(root):
    """Every broken link, mention and citation under root, as 'file:line: problem'."""
    root = os.path.abspath(root)
    files = [p for p in tree_files(root) if is_text(p) and os.path.relpath(p, root) != SELF]
    basenames = {os.path.basename(p) for p in tree_files(root)}
    problems = []

    def where(path, text, offset):
        return "%s:%d" % (os.path.relpath(path, root), text.count("\n", 0, offset) + 1)

    def resolve(path, target):
        """The existing file a mention names, or None."""
        for base in (root, os.path.dirname(path)):
            candidate = os.path.normpath(os.path.join(base, target))
            if os.path.exists(candidate):
                return candidate
        return None

    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        is_md = path.endswith(".md")
        prose = strip_code(text) if is_md else text

        if is_md:
            for m in LINK.finditer(prose):
                target = m.group(1)
                if not target or re.match(r"^[a-z][a-z0-9+.\-]*:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                        if file_part else path)
                if not os.path.exists(dest):
                    problems.append("%s: link to %s, which does not exist"
                                    % (where(path, prose, m.start()), file_part))
                elif anchor and dest.endswith(".md") and anchor not in headings(dest):
                    problems.append("%s: link to %s#%s, which has no such heading"
                                    % (where(path, prose, m.start()),
                                       os.path.relpath(dest, root), anchor))

        # Mentions: in a markdown file, the text outside links' targets.
        mention_text = LINK.sub(lambda m: " " * len(m.group(0)), prose) if is_md else text
        for m in MENTION.finditer(mention_text):
            name = m.group(1)
            if name in PLACEHOLDERS:
                continue
            dest = resolve(path, name)
            if dest is None and "/" not in name and name in basenames:
                continue
            if dest is None:
                problems.append("%s: mentions %s, which is not in the repository"
                                % (where(path, mention_text, m.start()), name))
                continue
            cited = SECTION.match(mention_text[m.end():])
            if cited:
                titles = heading_titles(dest)
                for title in filter(None, cited.groups()):
                    if title not in titles:
                        problems.append('%s: cites %s, "%s", which has no such section'
                                        % (where(path, mention_text, m.start()), name, title))
    return problems


class TheCheckerFindsWhatIsBroken(unittest.TestCase):
    """The checker itself, on trees made for it."""

    def tree(self, files):
        root = tempfile.mkdtemp(prefix="sl-links.")
        self.addCleanup(lambda: __import__("shutil").rmtree(root))
        for rel, body in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(body)
        return root

    def test_a_sound_tree_has_no_problems(self):
        root = self.tree({
            "README.md": "See [design](docs/design.md#the-lease-path) and [LICENSE](LICENSE),\n"
                         "[here](#usage), [a site](https://example.com/x.md).\n\n## Usage\n",
            "LICENSE": "text\n",
            "docs/design.md": "# Design\n\n## The lease path\n\n```\n# not a heading\n```\n",
            "daemon/lease.h": '// the lease path (docs/design.md, "The lease path").\n',
            "bench/run.sh": "# saved to latest.md under results/\n",
            "bench/results/latest.md": "figures\n",
            "Makefile": '# elsewhere (docs/design.md,\n# "The lease path").\n',
        })
        self.assertEqual(check(root), [])

    def test_a_link_to_a_missing_file_is_reported_with_its_line(self):
        root = self.tree({"README.md": "intro\n\nsee [ops](docs/operations.md)\n"})
        self.assertEqual(check(root),
                         ["README.md:3: link to docs/operations.md, which does not exist"])

    def test_an_anchor_that_names_no_heading_is_reported(self):
        root = self.tree({"README.md": "[x](docs/a.md#fallback) [y](#nowhere)\n# Top\n",
                          "docs/a.md": "# A\n\n## The lease path\n"})
        self.assertEqual(sorted(check(root)),
                         ["README.md:1: link to README.md#nowhere, which has no such heading",
                          "README.md:1: link to docs/a.md#fallback, which has no such heading"])

    def test_a_mention_in_a_comment_of_a_missing_document_is_reported(self):
        root = self.tree({"daemon/rpc.h": '// the wire contract in CONTRACT.md ("Protocol").\n'})
        self.assertEqual(check(root),
                         ["daemon/rpc.h:1: mentions CONTRACT.md, which is not in the repository"])

    def test_a_cited_section_that_does_not_exist_is_reported(self):
        root = self.tree({
            "docs/design.md": "# Design\n\n## The lease path\n",
            "tests/fleet_test.py": '"""docs/design.md, "The lease path" and "Fallback"."""\n',
        })
        self.assertEqual(check(root), ['tests/fleet_test.py:1: cites docs/design.md, "Fallback", '
                                       "which has no such section"])

    def test_headings_follow_githubs_anchor_rule(self):
        self.assertEqual(slug("Global concurrency: holdings"), "global-concurrency-holdings")
        self.assertEqual(slug("`health`"), "health")
        self.assertEqual(slug("Install and package"), "install-and-package")
        self.assertEqual(slug("Keys in Redis"), "keys-in-redis")


class TheRepository(unittest.TestCase):
    def test_every_cited_document_and_section_exists(self):
        problems = check(ROOT)
        self.assertEqual(problems, [], "\n" + "\n".join(problems))


if __name__ == "__main__":
    ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else DEFAULT_ROOT
    unittest.main()
