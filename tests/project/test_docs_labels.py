"""The docs label figures by date and commit (in bench/, not in the pages users read), name only files the
repository holds, and say what the exporter does with run tags."""
import re
import subprocess
from pathlib import Path

import pytest
from clusterwatch.collector.export import MAX_TAG_LABELS, MAX_TAG_NAME, MAX_TAG_VALUE

from tests.support.helpers import ROOT

THIS = Path(__file__).relative_to(ROOT).as_posix()


def tracked(*patterns):
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [p for p in out if (ROOT / p).is_file()]


DOCS = [p for p in tracked("*.md") if not p.startswith(("tests/", "shared/"))]
# a work period means nothing to a reader: "the third session", "a second full run", "this session"
WORK_PERIOD = re.compile(r"\b(first|second|third|fourth|fifth|sixth|this|that|previous|last|next)\s+"
                         r"(session|full run|sitting)", re.I)


@pytest.mark.parametrize("doc", DOCS)
def test_figures_are_labelled_by_date_and_commit_not_by_work_period(doc):
    lines = [f"{i}: {line.strip()}" for i, line in enumerate((ROOT / doc).read_text().splitlines(), 1)
             if WORK_PERIOD.search(line)]
    assert not lines, f"{doc}: label these by date and commit: {lines}"


# repository paths as docs and comments write them: a top-level folder, then a file with an extension
REPO_PATH = re.compile(r"(?<![\w./~-])((?:agent|bench|cli|clusterwatch|collector|deploy|docs|proto|reference|"
                       r"scripts|tests)/[\w./-]*\w\.(?:md|py|toml|ya?ml|sh|proto|json|env))\b")


def held(path):
    """In the repository, or in the installed package (clusterwatch/agent/... is agent/...)."""
    rest = path.removeprefix("clusterwatch/")
    return any((ROOT / p).exists() for p in (path, rest, f"proto/{path}"))


def test_docs_and_comments_name_only_files_the_repository_holds():
    missing = []
    for path in tracked("*.md", "*.py", "*.toml", "*.sh"):
        if path == THIS or re.search(r"_pb2(_grpc)?\.py$", path):  # generated: protoc's own paths
            continue
        text = (ROOT / path).read_text(errors="replace")
        for m in REPO_PATH.finditer(text):
            if "<" in m.group(1) or "*" in m.group(1) or held(m.group(1)):
                continue
            missing.append(f"{path}: {m.group(1)}")
        if re.search(r"(?<![\w/])DESIGN\.md", text):
            missing.append(f"{path}: DESIGN.md")
    assert not missing, missing


# the pages a user reads: measured figures live in bench/README.md, with their date and commit
USER_PAGES = [p for p in DOCS if p == "README.md" or p.startswith("docs/")]
COMMIT = re.compile(r"\b(?:commits?|at|before|after|since)\s+\(?[0-9a-f]{7,12}\b")
# a table whose header has a "before" and an "after" column
BEFORE_AFTER_TABLE = re.compile(r"^(\|[^\n]*\bbefore\b[^\n]*\|[^\n]*\bafter\b[^\n]*\|)\s*\n\|[-| :]+\|$", re.I | re.M)


@pytest.mark.parametrize("doc", USER_PAGES)
def test_user_pages_name_no_commit_and_hold_no_before_after_table(doc):
    text = (ROOT / doc).read_text()
    hashes = [f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in COMMIT.finditer(text)]
    assert not hashes, f"{doc}: commit hashes belong with the figures in bench/README.md: {hashes}"
    tables = BEFORE_AFTER_TABLE.findall(text)
    assert not tables, f"{doc}: a before/after table belongs in bench/README.md: {tables}"


def test_metrics_reference_says_what_becomes_of_run_tags():
    text = " ".join((ROOT / "docs" / "metrics.md").read_text().split())
    assert "`tag_<key>` labels" in text
    assert f"at most {MAX_TAG_LABELS} tags" in text
    assert f"the key cut to {MAX_TAG_NAME} characters, in lower case" in text
    assert "ASCII letters, digits and `_` turned into `_`" in text
    assert f"values cut to {MAX_TAG_VALUE} characters" in text


def section(doc, heading):
    """The text under a `## heading` of `doc`, up to the next heading of that level, on one line."""
    text = (ROOT / doc).read_text()
    at = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", at + 1)
    return " ".join(text[at:end if end > 0 else None].split())


def test_the_security_how_to_says_what_query_auth_auto_does():
    from clusterwatch.collector.queries.auth import MUNGE_RETRY_S

    who = section("docs/how-to/secure.md", "Who sees which job")
    # installed but not working: refused, retried, never open; open only without munge at all
    assert "installed on the collector host but does not work" in who
    assert "every query is refused" in who and f"tried again at most every {MUNGE_RETRY_S:.0f} s" in who
    assert "never falls back to showing every job to everyone" in who
    assert "Only a host without munge at all" in who and "with a warning" in who
    # the README's set-up by hand says it too, and names --query-auth
    readme = section("README.md", "A collector and two agents, by hand")
    assert "While munged does not answer, it refuses every query" in readme
    assert "`--query-auth" in readme


def test_the_operators_path_links_the_gpu_page():
    assert "(gpus.md)" in (ROOT / "docs" / "operators.md").read_text()
    assert (ROOT / "docs" / "gpus.md").is_file()
