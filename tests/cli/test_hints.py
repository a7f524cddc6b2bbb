"""Every hint that names an option names one the command really has (its click options).

A hint can reach the user from any command whose code path raises it, so an option in a
hint is only checkable when the hint says which command it belongs to: either it is
written as a command line in backticks (`bakery bake --wheel PATH`, `run.sh start
--tp N`), or the hint is raised inside that command's own function. A bare option in a
deep module (the old "allow fuzz with --fuzz N", shown by `bake`, which has no --fuzz)
is itself the defect."""

import ast
import re
from pathlib import Path

import click
import pytest

from bakery.cli.launch import launch
from bakery.cli.root import cli
from tests.conftest import REPO

PROGRAMS = {"bakery": cli, "run.sh": launch}
SCANNED = sorted((REPO / "bakery").rglob("*.py"))
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SPAN = re.compile(r"`([^`]*)`")


def options(command: click.Command) -> set[str]:
    return {o for p in command.params for o in [*p.opts, *p.secondary_opts]} | {"--help"}


def resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    """The click command a command line names, and the words after it."""
    command = PROGRAMS[words[0]]
    rest = words[1:]
    while isinstance(command, click.Group) and rest and rest[0] in command.commands:
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


def text(node: ast.expr, constants: dict[str, str]) -> str | None:
    """A hint's text, with every {placeholder} of an f-string as "{}"."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = text(node.left, constants), text(node.right, constants)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.IfExp):
        return " | ".join(
            t for t in (text(node.body, constants), text(node.orelse, constants)) if t
        )
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def command_of(function: ast.FunctionDef | None) -> click.Command | None:
    """The click command whose callback is ``function`` (None for any other code)."""
    if function is None:
        return None
    found = []

    def walk(command):
        if command.callback is not None and command.callback.__name__ == function.name:
            found.append(command)
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    for program in PROGRAMS.values():
        walk(program)
    return found[0] if len(found) == 1 else None


def hints(path: Path):
    """(line, enclosing function, hint text) for every ``hint=`` argument in ``path``, and
    for every string assigned to ``hint`` or to a ``*HINT*`` constant (passed on to a raise)."""
    tree = ast.parse(path.read_text())
    constants = {
        t.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for t in node.targets
        if isinstance(t, ast.Name) and isinstance(node.value.value, str)
    }
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]

    def outer(node):
        enclosing = [f for f in functions if f.lineno <= node.lineno <= f.end_lineno]
        return min(enclosing, key=lambda f: f.lineno, default=None)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and (t.id == "hint" or "HINT" in t.id) for t in node.targets
        ):
            hint = text(node.value, constants)
            assert hint is not None, f"{path}:{node.lineno}: a hint this test cannot read"
            yield node.lineno, outer(node), hint
        for keyword in getattr(node, "keywords", []):
            if keyword.arg != "hint":
                continue
            if isinstance(keyword.value, ast.Name) and (
                keyword.value.id == "hint" or "HINT" in keyword.value.id
            ):
                continue  # a variable: its assignments are checked above
            hint = text(keyword.value, constants)
            assert hint is not None, f"{path}:{node.lineno}: a hint this test cannot read"
            yield node.lineno, outer(node), hint


def problems(hint: str, command: click.Command | None) -> list[str]:
    out = []
    for span in SPAN.findall(hint):
        words = span.split()
        if words and words[0] in PROGRAMS:
            named, rest = resolve(words)
            out += [
                f"{o} is not an option of `{span}`"
                for o in OPTION.findall(" ".join(rest))
                if o not in options(named)
            ]
    bare = OPTION.findall(SPAN.sub("", hint))
    for option in bare:
        if command is None:
            out.append(f"{option} outside backticks, raised outside any command's own function")
        elif option not in options(command):
            out.append(f"{option} is not an option of {command.name}")
    return out


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_hint_names_only_real_options(path):
    found = []
    for line, function, hint in hints(path):
        found += [
            f"{path.name}:{line}: {p}: {hint!r}" for p in problems(hint, command_of(function))
        ]
    assert not found, "\n".join(found)


def test_the_checker_catches_the_hints_issue_11_names():
    bake = cli.commands["bake"]
    assert problems("refresh it, or allow fuzz with --fuzz N", bake)  # bake has no --fuzz
    assert problems("check the network, or pass --wheel PATH", None)  # deep module, bare
    assert problems("run `bakery linkcheck --wheel PATH`", None)  # linkcheck has no --wheel
    assert problems("set it with `run.sh stop --pp 2`", None)  # stop has no --pp
    assert not problems("put it in the cache with `bakery bake --wheel PATH`", None)
    assert not problems("allow fuzz with --fuzz N", cli.commands["apply"])
    assert not problems("`bakery verify compare --markdown R.md`", None)


def every_command(command: click.Command, path: str):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from every_command(sub, f"{path} {name}")


def undocumented(program: str, command: click.Command) -> list[str]:
    """``program``'s options and flags that `--help` lists with no text."""
    return [
        f"{path} {param.opts[0]}"
        for path, cmd in every_command(command, program)
        for param in cmd.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_every_option_says_what_it_does(program):
    assert undocumented(program, PROGRAMS[program]) == []


def test_an_option_without_help_is_caught():
    @click.command()
    @click.option("--grace", default=30.0)  # as `run.sh matrix --grace` had it
    def planted(grace):
        pass

    assert undocumented("run.sh", planted) == ["run.sh --grace"]
