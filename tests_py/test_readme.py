"""The code blocks and links of every Markdown file in the repository, checked
so that they cannot rot: every ```python block runs, each file's ```cmake and
```cpp blocks are built as one project against the installed package and run,
the blocks of the languages in NOT_EXECUTED are accepted only for the reason
given there, and every relative link names an existing file and heading."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import fuseops

from support.processes import run_python

ROOT = Path(__file__).resolve().parents[1]

# Build outputs and environments (the folders .gitignore lists); hidden
# folders (.git, .venv, .venv-cuda, .pytest_cache) are skipped as well.
NOT_DOCUMENTATION = {
    "build",
    "_skbuild",
    "dist",
    "bench-results",
    "gpu-results",
    "gpu-wheels",
    "demo-results",
    "__pycache__",
}

# The documents the README's table names: finding fewer means the search is broken.
DOCUMENTS = {
    "README.md",
    "CONTRIBUTING.md",
    "PERFORMANCE.md",
    "python/README.md",
    "cpp/README.md",
    "cuda/README.md",
    "tools/gdb/README.md",
}

EXECUTED = {
    "python": "run in a fresh interpreter",
    "cmake": "with the file's cpp block, built against the installed package and run",
    "cpp": "with the file's cmake block, built against the installed package and run",
}
NOT_EXECUTED = {
    "text": "not a program: what a program prints, what a person types at the gdb "
    "prompt, or a diagram; the gdb printers' output is checked by tests_py/test_gdb.py",
    "mermaid": "a chart GitHub draws from the numbers in it: the tokens/s bars that "
    "`bench --markdown` writes under a decode table (test_bench_markdown.py checks them)",
    "bash": "shell commands that install packages, build for minutes, need a GPU or "
    "write into the user's home (~/.gdbinit); CI runs the main ones itself (.ci/run: "
    "tools/run_tests.sh, tools/sanitize.sh, tools/cuda_compile_check.sh), and "
    "test_shell_blocks_name_what_exists checks the files and subcommands they name",
}


def markdown_files() -> list[Path]:
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not name.startswith(".")
            and name not in NOT_DOCUMENTATION
            and not name.endswith(".egg-info")
        )
        found += [Path(folder) / name for name in sorted(files) if name.endswith(".md")]
    return found


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Document:
    path: Path
    blocks: list[Block]
    prose: str  # the text outside fenced blocks, lines kept


FENCE = re.compile(r"^( *)(`{3,})(.*)$")


def parse(path: Path) -> Document:
    blocks, prose, lines = [], [], path.read_text().split("\n")
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            prose.append(lines[i])
            i += 1
            continue
        indent, fence, language = len(opening[1]), opening[2], opening[3].strip()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        assert i < len(lines), f"{path.relative_to(ROOT)}:{start}: fenced block never closed"
        blocks.append(Block(path, start, language, "\n".join(body) + "\n"))
        prose += [""] * (len(body) + 2)
        i += 1
    return Document(path, blocks, "\n".join(prose))


DOCS = [parse(path) for path in markdown_files()]
BLOCKS = [block for doc in DOCS for block in doc.blocks]


def blocks(language: str) -> list[Block]:
    return [block for block in BLOCKS if block.language == language]


def test_the_documents_are_found():
    assert DOCUMENTS <= {str(doc.path.relative_to(ROOT)) for doc in DOCS}


def test_every_fenced_block_is_executed_or_of_a_language_not_executed_for_a_reason():
    assert not set(EXECUTED) & set(NOT_EXECUTED)
    unknown = [
        f"{b.where}: ```{b.language}"
        for b in BLOCKS
        if b.language not in {**EXECUTED, **NOT_EXECUTED}
    ]
    assert not unknown, (
        "a block of no language, or of one neither executed nor listed in NOT_EXECUTED:\n"
        + "\n".join(unknown)
    )
    for doc in DOCS:
        languages = [block.language for block in doc.blocks]
        assert languages.count("cmake") == languages.count("cpp") <= 1, (
            f"{doc.path.relative_to(ROOT)}: one C++ project per file, one cmake and one cpp block"
        )


def indented_code_lines(doc: Document) -> list[int]:
    """Lines that open a Markdown indented code block, which would escape the
    checks here: 4 spaces after a blank line that follows top-level prose (in
    a list, indentation continues the item)."""
    lines, found, last_prose = doc.prose.split("\n"), [], ""
    for number, line in enumerate(lines, 1):
        previous = lines[number - 2] if number > 1 else ""
        if line.startswith("    ") and line.strip() and previous == "" and last_prose:
            if not last_prose.startswith(" ") and not re.match(r"([-*+]|\d+\.) ", last_prose):
                found.append(number)
        if line.strip():
            last_prose = line
    return found


def test_code_is_fenced():
    found = [f"{doc.path.relative_to(ROOT)}:{n}" for doc in DOCS for n in indented_code_lines(doc)]
    assert not found, "indented code blocks (fence them with a language):\n" + "\n".join(found)


def test_indented_code_is_detected(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Run:\n\n    bash tools/run_tests.sh\n\n- a list item\n\n    its second paragraph\n"
    )
    assert indented_code_lines(parse(doc)) == [3]


@pytest.mark.parametrize("block", blocks("python"), ids=lambda b: b.where)
def test_python_block_runs(block):
    result = run_python(block.code)
    assert result.returncode == 0, f"{block.where}:\n{result.stderr}"


def cpp_program(snippet: str) -> str:
    """The snippet as a program: its #include lines, then the rest as main's body."""
    lines = snippet.splitlines()
    includes = [line for line in lines if line.startswith("#include")]
    body = [line for line in lines if not line.startswith("#include")]
    return "\n".join(includes) + "\n\nint main() {\n" + "\n".join(body) + "\n}\n"


CPP_PROJECTS = [doc for doc in DOCS if any(block.language == "cmake" for block in doc.blocks)]


def test_the_cpp_projects_are_found():
    assert {"README.md", "cpp/README.md"} <= {
        str(doc.path.relative_to(ROOT)) for doc in CPP_PROJECTS
    }


@pytest.mark.slow
@pytest.mark.parametrize("doc", CPP_PROJECTS, ids=lambda doc: str(doc.path.relative_to(ROOT)))
def test_cpp_blocks_build_against_the_package_and_run(doc, tmp_path):
    [cmake_block] = [block for block in doc.blocks if block.language == "cmake"]
    [cpp_block] = [block for block in doc.blocks if block.language == "cpp"]
    (tmp_path / "CMakeLists.txt").write_text(cmake_block.code)
    (tmp_path / "main.cpp").write_text(cpp_program(cpp_block.code))
    cmake = shutil.which("cmake")
    assert cmake, "cmake is not on PATH"
    build = tmp_path / "build"

    def run(*args):
        result = subprocess.run(args, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (
            f"{cmake_block.where} {args}:\n{result.stdout}\n{result.stderr}"
        )
        return result

    run(
        cmake,
        "-S",
        str(tmp_path),
        "-B",
        str(build),
        "-G",
        "Ninja",
        f"-DCMAKE_PREFIX_PATH={fuseops.cmake_prefix_path}",
    )
    run(cmake, "--build", str(build))
    # The installed library finds torch by itself: no LD_LIBRARY_PATH.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    result = subprocess.run(
        [str(build / "app")], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{cpp_block.where}:\n{result.stderr}"


# Paths into the repository's own folders; build outputs (build/...) and
# placeholders (<venv>/...) are not checked.
REPO_PATH = re.compile(
    r"(?<![\w/.<>$-])((?:tools|tests_py|tests_cpp|cpp|cuda|python|cmake)/[\w./-]*\w)"
)
FUSEOPS_COMMAND = re.compile(r"-m fuseops ([\w-]+)")


def test_shell_blocks_name_what_exists():
    shell = blocks("bash")
    assert shell, "no ```bash blocks found"
    missing = [
        f"{b.where}: {p}"
        for b in shell
        for p in REPO_PATH.findall(b.code)
        if not (ROOT / p).exists()
    ]
    assert not missing, "shell blocks name files that do not exist:\n" + "\n".join(missing)
    commands = {c for b in shell for c in FUSEOPS_COMMAND.findall(b.code)}
    assert commands, "no `python -m fuseops` command found in the shell blocks"
    for command in sorted(commands):
        result = subprocess.run(
            [sys.executable, "-m", "fuseops", command, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"`python -m fuseops {command}`:\n{result.stderr}"


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered (code spans and
    link targets dropped), lower case, punctuation other than - and _ removed,
    spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Document) -> set[str]:
    """The anchors of the document's headings; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", doc.prose, flags=re.M):
        slug = github_slug(match[1])
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def test_github_slug():
    assert github_slug("Special values (NaN, Inf, -0)") == "special-values-nan-inf--0"
    assert (
        github_slug("`out=` and memory shared with inputs") == "out-and-memory-shared-with-inputs"
    )
    assert github_slug("2:4 sparse linear layers") == "24-sparse-linear-layers"
    assert github_slug("Memory the backward saves (`--modes fresh-grad`)") == (
        "memory-the-backward-saves---modes-fresh-grad"
    )


LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(doc: Document) -> list[str]:
    """The targets of the document's inline links and images, outside code."""
    text = re.sub(r"(`+)(?:(?!\1).)+?\1", "", doc.prose, flags=re.S)
    return LINK.findall(text)


def test_relative_links_name_existing_files_and_headings():
    by_path = {doc.path.resolve(): doc for doc in DOCS}
    broken, checked = [], 0
    for doc in DOCS:
        for target in links(doc):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # a URL: not checked offline
            checked += 1
            path, _, anchor = target.partition("#")
            resolved = (doc.path.parent / path).resolve() if path else doc.path.resolve()
            where = f"{doc.path.relative_to(ROOT)}: ({target})"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif anchor:
                if resolved not in by_path:
                    broken.append(
                        f"{where}: an anchor into a file that is not one of the Markdown documents"
                    )
                elif anchor not in anchors(by_path[resolved]):
                    broken.append(f"{where}: no heading with that anchor")
    assert checked, "no relative links found"
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_link_check_finds_a_broken_anchor(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n\n[ok](#title), [broken](#no-such), `[in code](#x)`\n\n```text\n# not a heading\n```\n"
    )
    parsed = parse(doc)
    assert links(parsed) == ["#title", "#no-such"]
    assert anchors(parsed) == {"title"}
