"""The docs as a newcomer meets them: pasteable examples that run, no paths of a developer's
machine, and a docstring on every public name of the API reference (`make docs`)."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Dated measurement records moved out of the user pages are read by people too.
RECORDS = sorted((ROOT / "bench" / "results").rglob("*.md"))

# A code block marked ```python runnable is a whole program that runs as pasted, in an empty
# folder, in a few seconds; other ```python blocks are excerpts.
RUNNABLE = re.compile(r"^```python runnable\n(.*?)^```", re.M | re.S)


def runnable_blocks() -> list:
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for match in RUNNABLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append(pytest.param(match.group(1), id=f"{page.relative_to(ROOT)}:{line}"))
    return blocks


BLOCKS = runnable_blocks()


def test_the_readme_quick_start_has_runnable_blocks():
    """Proves: the convention is in use, so the test below cannot pass by finding nothing."""
    assert [b for b in BLOCKS if b.id.startswith("README.md:")], "README.md has no ```python runnable block"


@pytest.mark.parametrize("code", BLOCKS)
def test_a_runnable_doc_block_runs_as_pasted(code, tmp_path):
    """Proves: a block marked runnable runs in a fresh interpreter in an empty folder."""
    script = tmp_path / "block.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0, f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


# Paths of somebody's machine: home and scratch folders, worktrees, numbered venvs. System paths
# (/dev/shm, /proc, /usr/bin/python3), install prefixes (/opt/spindle), example data folders
# (/scratch/shards, /data/...) and the one fixed path spindle itself uses are fine.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|root|Users|tmp|var/tmp)/[^\s`'\")\]]*"
                          r"|\bvenv\d+\b|\.venv/lib/python")
ALLOWED = {"/tmp/spindle-uid65534.lock"}  # python/spindle/bench/harness.py's UID_LOCK


def test_the_docs_name_no_path_of_a_developers_machine():
    """Proves: README, docs/ and the dated records in bench/results name no machine path."""
    found = []
    for page in PAGES + RECORDS:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for match in MACHINE_PATH.finditer(line):
                if match.group(0).rstrip(".,;:") not in ALLOWED:
                    found.append(f"{page.relative_to(ROOT)}:{n}: {match.group(0)}")
    assert not found, "machine paths in the docs:\n" + "\n".join(found)


def test_the_machine_path_check_catches_a_worktree_venv():
    """Proves: the pattern above finds the kinds of path the docs once had."""
    for line in ("ran in `/work/wt/native/.venv-peers/bin/python`", "--out /tmp/sb-out", "/work/venv3/bin/python",
                 "/home/me/spindle"):
        assert MACHINE_PATH.search(line), line
    for line in ("/dev/shm/spindle-ledger.<uid>", "/proc/<pid>/task", "Debian's `/usr/bin/python3`", ".venv-peers/bin/python",
                 "cmake --install build --prefix /opt/spindle", 'cache_dir="/scratch/shards"'):
        assert not MACHINE_PATH.search(line), line


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_docs_relative_links_reach_files():
    """Proves: every relative link of README, docs/ and the records names a file of the tree."""
    broken = []
    for page in PAGES + RECORDS:
        for target in LINK.findall(page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


ANCHOR_LINK = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def heading_anchors(page: Path) -> set:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped, spaces as '-'."""
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+ (.*)$", page.read_text(), re.M)}


def test_the_docs_links_to_a_section_name_a_heading_of_that_page():
    """Proves: every `page.md#section` link of README and docs/ names a heading the page has."""
    broken = []
    for page in PAGES:
        for target, anchor in ANCHOR_LINK.findall(page.read_text()):
            linked = (page.parent / target) if target else page
            if linked.suffix == ".md" and linked.exists() and anchor not in heading_anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, "links to missing sections:\n" + "\n".join(broken)


def _script(path: str):
    """The module of a script of the repository that is not a package (docs/api_reference.py, ...)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_in_the_api_reference_has_a_docstring():
    """Proves: `make docs` renders a docstring for every public module, class, function and method."""
    import pdoc.doc

    api = _script("docs/api_reference.py")
    missing = []

    def walk(doc):
        for member in doc.members.values():
            if member.name.startswith("_") or isinstance(member, (pdoc.doc.Module, pdoc.doc.Variable)):
                continue
            # Inherited from builtins or from the peer a drop-in subclasses (torch's DataLoader):
            # documented there.
            if member.taken_from[0] == "builtins" or member.taken_from[0].split(".")[0] in ("torch", "torchdata"):
                continue
            if not member.docstring.strip():
                missing.append(member.fullname)
            if isinstance(member, pdoc.doc.Class):
                walk(member)

    for module in api.load_modules():
        doc = pdoc.doc.Module(module)
        if not doc.docstring.strip():
            missing.append(doc.fullname)
        walk(doc)
        for sub in doc.submodules:
            walk(sub)
    assert not missing, "public names without a docstring:\n" + "\n".join(missing)


def test_every_docs_page_states_the_question_it_answers():
    """Proves: each page of docs/ opens (within its first lines) with the one question it answers."""
    missing = [page.name for page in PAGES[1:]
               if not any(line.startswith("**Question:") for line in page.read_text().splitlines()[:6])]
    assert not missing, "pages without a **Question:** line at the top: " + ", ".join(missing)


def test_the_benchmark_tables_are_rendered_from_the_results_json():
    """Proves: every generated table of docs/benchmarks.md is what bench/report_docs.py renders from
    bench/results/*.json now (run `python bench/report_docs.py` after a new result)."""
    report = _script("bench/report_docs.py")
    page = report.PAGE.read_text()
    assert report.render(page) == page, "docs/benchmarks.md is out of date: run python bench/report_docs.py"


def test_the_benchmark_check_catches_an_edited_figure():
    """Proves: a figure changed by hand inside a generated part is seen as out of date."""
    report = _script("bench/report_docs.py")
    page = report.PAGE.read_text()
    part = report.PART.search(page)
    cut = part.start("body") + part.group("body").index("| spindle | ") + len("| spindle | ")
    edited = page[:cut] + "9" + page[cut:]
    assert report.render(edited) != edited


# The module tree of docs/architecture.md: the fenced block after "python/spindle/", where a line
# whose first word ends in "/" opens a package, and the *.py names on it and on the lines indented
# deeper belong to it (its __init__.py too); *.py names on a line at the package's depth or
# shallower are top-level.
def tree_modules(page: str) -> set:
    block = page.split("python/spindle/", 1)[1].split("```", 1)[0]
    found, package, depth = set(), None, -1
    for line in block.splitlines():
        words = line.split()
        if not words:
            continue
        indent = len(line) - len(line.lstrip())
        if words[0].endswith("/"):
            package, depth = words[0], indent
            found.add(package + "__init__.py")  # naming the package names its __init__
        elif indent <= depth:
            package, depth = None, -1
        for word in words:
            for name in re.findall(r"[\w]+\.py\b", word):
                found.add((package or "") + name)
    return found


def package_modules() -> set:
    base = ROOT / "python" / "spindle"
    return {p.relative_to(base).as_posix() for p in base.rglob("*.py")}


def test_the_architecture_tree_lists_every_module_of_the_package():
    """Proves: each module of python/spindle is named in docs/architecture.md's tree, in its package."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    missing = package_modules() - tree_modules(page)
    assert not missing, "modules missing from docs/architecture.md's tree:\n" + "\n".join(sorted(missing))


def test_the_tree_check_finds_a_module_left_out():
    """Proves: a tree with one module's name removed lacks exactly that module."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    tree = tree_modules(page)
    assert "_state/elastic.py" in tree
    cut = page.replace(" elastic.py", "", 1)
    assert tree - tree_modules(cut) == {"_state/elastic.py"}
