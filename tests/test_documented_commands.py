"""Every command the documentation gives still works as written.

The commands are taken from the documents users copy commands from (`DOCS`): every line of a
shell code block (`bash`, `sh`, ...; `\\` continuations joined, comments dropped, `&&` chains
split) and every inline code span that starts like a command; and from every bench command's
`--help`, whose examples (indented lines that start like a command) must also be right, and
present. Each is checked without running
it (CI runs the ones that run: `uv run pytest`, the per-package test commands, the main job,
the smoke installs):

- `bench-*`, `python -m bench ...` and `torchrun ... -m bench ...`: parsed by the command's own
  parser (`bench.commands.<name>.COMMAND`), torchrun's options by torchrun's; files they name
  may be placeholders;
- `pytest`: the paths exist and the `-m` markers are registered; `uv run --package P pytest`:
  P is a workspace package and CI runs P's test command;
- `pip install`: every local package exists and has the extras named;
- `uv run` and its options, and any other program, must be known.

A failure names the document and line. A span holding a placeholder (`<name>`, `...`) is a
template, not a command, and is skipped.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser as torchrun_parser

from bench.__main__ import PREFIX, commands

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [ROOT / "README.md", *ROOT.glob("packages/*/README.md"), *ROOT.glob("docs/design/*.md")]
)
SHELL_FENCES = {"bash", "sh", "shell", "console"}
# Programs a document may name that this test does not check further (git, shell built-ins,
# profilers run around a command, the linter CI runs).
OTHER_PROGRAMS = {"git", "export", "cd", "nsys", "ncu", "ruff"}
# `uv run` options: how many values each takes.
UV_RUN_OPTIONS = {"--package": 1, "--with": 1, "--extra": 1, "--locked": 0, "--frozen": 0}
PIP_INSTALL_FLAGS = {"--no-deps", "--no-build-isolation", "-e", "--editable", "-q", "--quiet"}
# An inline code span that starts like this is a command (and `bench-...` alone names one).
COMMAND_START = re.compile(
    r"^(uv (run|sync)\b|python3? -m |pip install |torchrun |bench-[a-z-]+(\s|$))"
)
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|…")
SUBSTITUTION = re.compile(r"\$\([^()]*\)")  # `$(...)`: a value, not a command of its own


@dataclass(frozen=True)
class Documented:
    """One command of one document: where it is, its words, and whether it stands in prose
    (an inline span, where a bare `bench-x` names the command rather than runs it)."""

    where: str
    argv: list[str]
    inline: bool

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def _split(text: str) -> Iterator[list[str]]:
    """The simple commands of a shell line: comments dropped, `&&` / `;` chains split."""
    text = SUBSTITUTION.sub("SUBSTITUTED", text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    words: list[str] = []
    for word in lexer:
        if word in ("&&", ";", "||", "|"):
            if words:
                yield words
            words = []
        else:
            words.append(word)
    if words:
        yield words


def _shell_lines(lines: list[str]) -> Iterator[tuple[int, str]]:
    """The commands of a code block's lines (1-based line numbers), continuations joined."""
    start, parts = 0, []
    for number, line in lines:
        if not parts:
            start = number
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        text = " ".join(parts).strip()
        parts = []
        if text and not text.startswith("#"):
            yield start, text


def documented_commands(path: Path) -> Iterator[Documented]:
    """Every command `path` gives, in order."""
    name = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    block: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        marker = line.strip()
        if marker.startswith("```"):
            if fence is None:
                fence = marker[3:].strip().lower()
                block = []
            else:
                if fence in SHELL_FENCES:
                    for start, text in _shell_lines(block):
                        for argv in _split(text):
                            yield Documented(f"{name}:{start}", argv, inline=False)
                fence = None
            continue
        if fence is None:
            prose.append((number, line))
        else:
            block.append((number, line))
    yield from _inline_commands(name, prose)


def _inline_commands(name: str, prose: list[tuple[int, str]]) -> Iterator[Documented]:
    """Commands in inline code spans of the prose (a span may run over a line break)."""
    text = "\n".join(line for _, line in prose)
    starts = [number for number, _ in prose]
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        span = " ".join(match.group(1).split())
        if not COMMAND_START.match(span) or " = " in span:
            continue
        line = starts[text.count("\n", 0, match.start())]
        for argv in _split(span):
            yield Documented(f"{name}:{line}", argv, inline=True)


def help_examples(name: str) -> Iterator[Documented]:
    """The examples in bench command `name`'s `--help`: its indented lines that start like a
    command (a description's prose is not indented)."""
    text = _command(name).parser().format_help()
    lines = [
        (number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if line[:1].isspace() or _continues(text.splitlines(), number)
    ]
    for start, line in _shell_lines(lines):
        if COMMAND_START.match(line.strip()) and not line.strip().startswith(f"{name}:"):
            for argv in _split(line):
                yield Documented(f"{name} --help, line {start}", argv, inline=False)


def _continues(lines: list[str], number: int) -> bool:
    return number > 1 and lines[number - 2].rstrip().endswith("\\")


def _command(name: str):
    """The `Command` of bench command `name` (`bench-attn` or `attn`)."""
    prog = name if name.startswith(PREFIX) else PREFIX + name
    table = commands()
    assert prog in table, f"no command {prog!r}; the commands are {', '.join(table)}"
    return __import__(table[prog].partition(":")[0], fromlist=["COMMAND"]).COMMAND


ALL = [command for doc in DOCS for command in documented_commands(doc)]
ALL += [command for name in commands() for command in help_examples(name)]


def _parse(parser, argv: list[str]) -> str | None:
    """Parse `argv` with an argparse parser: None when it parses (or asks for help), else the
    parser's error message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as exit_:
            return None if exit_.code == 0 else err.getvalue().strip().splitlines()[-1]
    return None


def _check_bench(name: str, args: list[str], *, inline: bool) -> None:
    command = _command(name)
    if inline and not args:
        return  # prose naming the command
    error = _parse(command.parser(), args)
    assert error is None, error


def _check_python(args: list[str], *, inline: bool) -> None:
    if args[:2] == ["-m", "bench"]:
        rest = args[2:]
        if not rest or rest[0] in ("-h", "--help"):
            return
        _check_bench(rest[0], rest[1:], inline=inline)
    elif args[:2] == ["-m", "pytest"]:
        _check_pytest(args[2:])
    elif args and args[0].endswith(".py"):
        assert (ROOT / args[0]).is_file(), f"no script {args[0]}"
    else:
        raise AssertionError(f"python {shlex.join(args)}: not a command this test knows")


def _markers() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {line.partition(":")[0].strip() for line in config.get("markers", [])}


def _check_pytest(args: list[str], *, package: str | None = None) -> None:
    words = iter(args)
    for word in words:
        if word == "-m":
            marker = next(words)
            assert marker in _markers(), f"pytest marker {marker!r} is not registered"
        elif not word.startswith("-"):
            assert (ROOT / word).exists(), f"pytest path {word} does not exist"
    if package is not None:
        assert package in _ci_per_package(), f"CI does not run {package}'s test command"


def _ci_per_package() -> set[str]:
    """`cs336sys-<pkg>` for every package whose own test command `.ci/run` runs."""
    script = (ROOT / ".ci" / "run").read_text()
    loop = re.search(r"per_package\(\) \{.*?for pkg in ([^;]+);", script, re.DOTALL)
    assert loop, ".ci/run has no per_package loop"
    return {f"cs336sys-{pkg}" for pkg in loop.group(1).split()}


def _packages() -> dict[str, Path]:
    """Workspace package name -> its folder."""
    folders = (p.parent for p in ROOT.glob("packages/*/pyproject.toml"))
    return {
        tomllib.loads((f / "pyproject.toml").read_text())["project"]["name"]: f for f in folders
    }


def _check_pip(args: list[str]) -> None:
    assert args[:1] == ["install"], f"pip {shlex.join(args)}: only pip install is documented"
    by_name = _packages()
    for word in args[1:]:
        if word.startswith("-"):
            assert word in PIP_INSTALL_FLAGS, f"pip install option {word} is not one we document"
            continue
        target, _, extras = word.partition("[")
        folder = by_name.get(target) or ROOT / target
        assert (folder / "pyproject.toml").is_file(), f"{target} is not a package of this project"
        declared = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        wanted = {e for e in extras.rstrip("]").split(",") if e}
        missing = wanted - set(declared.get("optional-dependencies", {}))
        assert not missing, f"{target} has no extra {sorted(missing)}"


def _check_torchrun(args: list[str]) -> None:
    error = _parse(torchrun_parser(), args)
    assert error is None, f"torchrun: {error}"
    parsed = torchrun_parser().parse_args(args)
    assert parsed.module and parsed.training_script == "bench", "torchrun runs -m bench here"
    _check_bench(parsed.training_script_args[0], parsed.training_script_args[1:], inline=False)


def check(command: Documented) -> None:
    """Check one documented command (see the module docstring); AssertionError if it is wrong."""
    argv = list(command.argv)
    package = None
    if argv[0] == "uv":
        assert argv[1:2] in (["run"], ["sync"]), f"uv {argv[1:2]}: not a command we document"
        if argv[1] == "sync":
            return
        argv = argv[2:]
        while argv and argv[0].startswith("-"):
            option = argv.pop(0)
            assert option in UV_RUN_OPTIONS, f"uv run option {option} is not one we document"
            values = [argv.pop(0) for _ in range(UV_RUN_OPTIONS[option])]
            if option == "--package":
                package = values[0]
                assert package in _packages(), f"--package {package}: no such workspace package"
    program, args = argv[0], argv[1:]
    if program.startswith(PREFIX):
        _check_bench(program, args, inline=command.inline)
    elif program in ("python", "python3"):
        _check_python(args, inline=command.inline)
    elif program == "pytest":
        _check_pytest(args, package=package)
    elif program == "pip":
        _check_pip(args)
    elif program == "torchrun":
        _check_torchrun(args)
    else:
        assert program in OTHER_PROGRAMS, f"{program}: not a program this project documents"


@pytest.mark.parametrize("command", ALL, ids=str)
def test_documented_command(command: Documented):
    if any(PLACEHOLDER.search(word) for word in command.argv):
        pytest.skip("a template (a placeholder in it), not a command")
    try:
        check(command)
    except AssertionError as error:
        pytest.fail(f"{command}\n  {error}", pytrace=False)


def test_the_documents_give_commands():
    """The extraction finds the commands (a change of format would make this test vacuous)."""
    found = {(c.argv[0], c.argv[1]) for c in ALL if len(c.argv) > 1}
    assert ("uv", "run") in found and ("pip", "install") in found
    assert sum(c.argv[:2] == ["uv", "run"] and c.argv[2].startswith(PREFIX) for c in ALL) > 20


@pytest.mark.parametrize("name", commands())
def test_every_command_shows_examples_of_itself(name):
    examples = [c for c in help_examples(name) if c.argv[0] == name or "bench" in c.argv[:4]]
    assert examples, f"{name} --help gives no example of its use"


def test_a_wrong_command_fails_naming_it():
    wrong = [
        Documented("X.md:1", ["uv", "run", "bench-attn", "--no-such-option"], inline=False),
        Documented("X.md:2", ["bench-nope"], inline=True),
        Documented("X.md:3", ["python", "-m", "bench", "model", "--size", "huge"], inline=False),
        Documented("X.md:4", ["pip", "install", "./packages/lmcore[nope]"], inline=False),
        Documented("X.md:5", ["uv", "run", "--package", "cs336sys-x", "pytest"], inline=False),
        Documented("X.md:6", ["pytest", "-m", "slowish", "packages/fa2"], inline=False),
        Documented("X.md:7", ["make", "all"], inline=False),
    ]
    for command in wrong:
        with pytest.raises(AssertionError):
            check(command)


def test_shell_lines_are_split_like_a_shell():
    lines = [(1, "uv run ruff check . && uv run ruff format --check .  # lint"), (2, "a \\")]
    lines += [(3, "  --b 'c d'"), (4, "export X=$(ls -d y/* | paste -sd:)")]
    commands_ = [argv for _, text in _shell_lines(lines) for argv in _split(text)]
    assert commands_ == [
        ["uv", "run", "ruff", "check", "."],
        ["uv", "run", "ruff", "format", "--check", "."],
        ["a", "--b", "c d"],
        ["export", "X=SUBSTITUTED"],
    ]
