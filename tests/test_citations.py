"""Every file the project's own .py and .md files cite exists in the repository, so that a move or a
rename cannot leave a dead pointer behind (a docstring naming a module that moved, a page that is gone)."""

import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NOT_YET: set[str] = set()  # pages left out while being rewritten (none now)

# A cited path: words joined by "/" ending in .py or .md, not part of a longer path, URL or dotted name.
CITED = re.compile(r"(?<![\w./~:@-])((?:[\w-]+/)*[\w-]+\.(?:py|md))(?![\w/-])")
# Not the repository's: URLs, absolute and home paths, the venv, and what the tool writes (result/, output/,
# data/: the report's summary.md among them).
ELSEWHERE = re.compile(r"https?://\S*|(?<![\w.])(?:/|~/|\$\w+/|\.\./|venv/|site-packages/|result/|output/|data/)\S*"
                       r"|(?<![\w./-])summary\.md")
# Other projects' files, named where the code follows them.
FOREIGN = {"_system.py": "pyperf", "setup.py": "an sdist pip builds", "torch/_inductor/utils.py": "torch",
           "torch/backends/xeon/run_cpu.py": "torch"}
# The measurement log names the one-off harnesses a session timed with; they were never kept.
SCRATCH = {"docs/measurements.md": {"pair.py", "pairw.py", "clipair.py", "phase.py", "phase3.py", "phase4.py",
                                    "cpu_tree.py", "util.py", "sendbench.py", "fbench.py"}}


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [path for path in out.split("\0") if path]


def _exists(cited: str, citing: str, tracked: set[str], names: set[str]) -> bool:
    """A path with a folder is relative to the root or to the citing file's folder or one above it
    (a module of worker/ may name its sibling folder's files from worker/); a bare file name is one the
    repository has somewhere."""
    if "/" not in cited:
        return cited in names
    folder = Path(citing).parent
    for base in (folder, *folder.parents):
        if (base / cited).as_posix().removeprefix("./") in tracked:
            return True
    return False


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of what a reader reads as prose: every line of a page; a module's comments and
    docstrings (a string the code uses, such as a file name it opens, is not a citation)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return list(enumerate(text.splitlines(), 1))
    out, statement_start = [], True
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and statement_start):
            out += [(token.start[0] + i, line) for i, line in enumerate(token.string.splitlines())]
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            statement_start = token.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return out


def dead_citations(files: list[str] | None = None) -> list[str]:
    """'file:line: path' for every cited path that the repository does not contain."""
    tracked = set(_tracked())
    names = {Path(path).name for path in tracked}
    dead = []
    for citing in files if files is not None else sorted(tracked):
        if not citing.endswith((".py", ".md")) or citing in NOT_YET or not (ROOT / citing).is_file():
            continue
        for number, line in _prose(ROOT / citing):
            for cited in CITED.findall(ELSEWHERE.sub(" ", line)):
                if cited in FOREIGN or cited in SCRATCH.get(citing, ()):
                    continue
                if not _exists(cited, citing, tracked, names):
                    dead.append(f"{citing}:{number}: {cited}")
    return dead


def test_every_file_the_code_and_the_docs_cite_exists():
    dead = dead_citations()
    assert dead == [], "cited files the repository does not contain:\n" + "\n".join(dead)


def test_a_moved_module_leaves_a_dead_citation_that_the_check_names(tmp_path):
    tracked = set(_tracked())
    assert "worker/trainers/harness.py" in tracked and "docs/measurements.md" in tracked
    names = {Path(path).name for path in tracked}
    assert _exists("worker/trainers/harness.py", "README.md", tracked, names)
    assert _exists("trainers/harness.py", "worker/loop.py", tracked, names)  # relative to worker/
    assert not _exists("worker/harness.py", "README.md", tracked, names)
    assert not _exists("DESIGN.md", "README.md", tracked, names)
    line = "see DESIGN.md, https://x.org/a/b.py, /tmp/x/y.py, venv/lib/z.py, result/summary.md and docs/x.md"
    assert CITED.findall(ELSEWHERE.sub(" ", line)) == ["DESIGN.md", "docs/x.md"]
    module = tmp_path / "m.py"
    module.write_text('"""Moved: see worker/old.py."""\nPATH = "data/x.md"  # and docs/gone.md\nOPEN = "a.py"\n')
    assert [(n, CITED.findall(ELSEWHERE.sub(" ", text))) for n, text in _prose(module)] == [
        (1, ["worker/old.py"]), (2, ["docs/gone.md"])]
