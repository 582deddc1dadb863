"""How the command line looks: plain help reflowed to the terminal, one error style.

Help is plain text (the root app sets ``rich_markup_mode=None``): no boxes, nothing read
as markup (``pip install 'ezflow-pubsub[zenoh]'`` shows as written), paragraphs reflowed
to the terminal's width (``COLUMNS`` wins, at most 80), while indented blocks - the
examples - are printed as written, so that a command stays whole for copying. An option
that takes a value shows what it takes (``--address HOST:PORT``, ``--interval FLOAT``);
a flag shows nothing (typer alone writes ``<bool>``/``<str>`` next to every option).

Errors have one style, ezflow's own and those of the command-line parser alike: a line
``error: ...`` on stderr; a command line that cannot be parsed (a wrong flag, a missing
argument, a bad value) adds one ``usage:`` line and the exit status is 2.

:func:`plain` gives every command of a typer app these classes (:class:`PlainCommand`,
:class:`PlainGroup`); :class:`RootGroup` is the ``ezflow`` group itself, which also
prints the errors.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

try:  # typer >= 0.24 ships its own copy of click
    from typer._click.core import Context
    from typer._click.exceptions import ClickException, UsageError
    from typer._click.formatting import HelpFormatter
except ImportError:  # pragma: no cover - typer with click as a dependency
    from click.core import Context  # type: ignore[import-not-found,no-redef,unused-ignore]
    from click.exceptions import (  # type: ignore[import-not-found,no-redef,unused-ignore]
        ClickException,
        UsageError,
    )
    from click.formatting import (  # type: ignore[import-not-found,no-redef,unused-ignore]
        HelpFormatter,
    )

__all__ = ["PlainCommand", "PlainGroup", "RootGroup", "plain", "usage_error"]

#: typer's type display at the end of a parameter's name column: `` <str>``, `` <int>``.
_TYPE_SUFFIX = re.compile(r" <([^<>]+)>$")
#: What an option's value is called in help when the option names none (click's names).
_VALUE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH"}
#: The end of a help text's first sentence.
_SENTENCE_END = re.compile(r"\.(\s|$)")


#: Stands for a hyphen inside a word while help is wrapped: a line never ends inside
#: ``--drain-timeout`` or ``ezflow-pubsub`` (a non-breaking hyphen, put back after).
_KEEP = "\u2011"
_WORD_HYPHEN = re.compile(r"(?<=[\w-])-(?=[\w-])|(?<=\s)-(?=-\w)|^-(?=-\w)", re.MULTILINE)


class _Formatter(HelpFormatter):
    """click's help formatter, wrapping only at spaces."""

    def write_text(self, text: str) -> None:
        super().write_text(_WORD_HYPHEN.sub(_KEEP, text))

    def write_dl(self, rows: Sequence[tuple[str, str]], *args: Any, **kwargs: Any) -> None:
        super().write_dl([(a, _WORD_HYPHEN.sub(_KEEP, b)) for a, b in rows], *args, **kwargs)

    def getvalue(self) -> str:
        return super().getvalue().replace(_KEEP, "-")


class _Context(Context):
    formatter_class = _Formatter


def _value_name(label: str) -> str:
    if "|" in label:  # a choice: the values themselves
        return f"[{label}]"
    label = label.removesuffix(" range")  # a bounded number: the bounds are in its help
    if label.startswith("list[") and label.endswith("]"):  # repeatable: one value's name
        label = label[5:-1]
    return _VALUE_NAMES.get(label, label.upper())


def _records(command: Any, ctx: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The (name, help) rows of *command*'s arguments and options, without typer's
    ``<type>`` labels: an argument is its metavar, an option its flags and, if it takes
    a value, the name of that value."""
    arguments: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        name, text = record
        if isinstance(param, TyperArgument):
            arguments.append((param.metavar or (param.name or "").upper(), text))
        else:
            options.append((_TYPE_SUFFIX.sub(lambda m: " " + _value_name(m.group(1)), name), text))
    return arguments, options


def _verbatim_examples(text: str) -> str:
    """*text* with each indented paragraph marked ``\\b`` (click's "do not rewrap"): an
    example command is printed on one line, as written."""
    paragraphs = text.split("\n\n")
    for i, paragraph in enumerate(paragraphs):
        lines = paragraph.splitlines()
        if lines and all(line.startswith(" ") for line in lines if line.strip()):
            paragraphs[i] = "\b\n" + paragraph
    return "\n\n".join(paragraphs)


def _help_text(command: Any, formatter: Any) -> None:
    text = inspect.cleandoc(command.help or "").partition("\f")[0]
    if text:
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text(_verbatim_examples(text))


def _usage_pieces(command: Any, ctx: Any) -> list[str]:
    """The usage line's words: ``[OPTIONS]``, then each argument as its help lists it
    (``TOPIC``; ``[TOPIC]`` when optional; typer alone writes ``{topic}``)."""
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if isinstance(param, TyperArgument):
            name = param.metavar or (param.name or "").upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name if param.nargs == 1 else f"{name}...")
        else:
            pieces += param.get_usage_pieces(ctx)
    return pieces


class PlainCommand(TyperCommand):
    """A command with plain help (see the module docstring)."""

    context_class = _Context

    def format_help_text(self, ctx: Any, formatter: Any) -> None:
        _help_text(self, formatter)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments, options = _records(self, ctx)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        if options:
            with formatter.section("Options"):
                formatter.write_dl(options)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)


class PlainGroup(TyperGroup):
    """A command group with plain help (see the module docstring)."""

    context_class = _Context

    def format_help_text(self, ctx: Any, formatter: Any) -> None:
        _help_text(self, formatter)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _, options = _records(self, ctx)
        if options:
            with formatter.section("Options"):
                formatter.write_dl(options)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """Each command with the first sentence of its help, whole (wrapped, never cut
        short with "...")."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.short_help or _first_sentence(command.help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage_pieces(self, ctx), self.subcommand_metavar]


def _first_sentence(text: str) -> str:
    paragraph = " ".join(inspect.cleandoc(text).split("\n\n", 1)[0].split())
    end = _SENTENCE_END.search(paragraph)
    return paragraph if end is None else paragraph[: end.start() + 1]


def plain(app: typer.Typer) -> None:
    """Make every command and group of *app* (registered so far, sub-apps included)
    a :class:`PlainCommand` / :class:`PlainGroup`, unless it names a class of its own."""
    for command in app.registered_commands:
        if command.cls is None or command.cls is TyperCommand:  # (typer's default)
            command.cls = PlainCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            plain(group.typer_instance)
            info = group.typer_instance.info
            if not isinstance(info.cls, type):  # unset (typer's Default placeholder)
                info.cls = PlainGroup


def _sentence(message: str) -> str:
    """A parser message in ezflow's style: lower case first, no final period."""
    message = message.strip()
    # "... (Possible options: --verbose)": every clause in lower case.
    message = re.sub(r"\(([A-Z])(?=[a-z])", lambda m: "(" + m.group(1).lower(), message)
    if message.endswith(".") and not message.endswith(".."):
        message = message[:-1]
    if len(message) > 1 and message[0].isupper() and not message[1].isupper():
        message = message[0].lower() + message[1:]
    return message


def usage_error(exc: UsageError) -> str:
    """The lines printed for a command line the parser refused: ``error: ...`` and, when
    the command is known, ``usage: ...`` with where to find its help."""
    lines = [f"error: {_sentence(exc.format_message())}"]
    ctx = exc.ctx
    if ctx is not None:
        usage = ctx.get_usage().strip()
        usage = re.sub(r"^Usage:\s*", "", usage)
        usage = " ".join(usage.split())
        lines.append(f"usage: {usage}  (`{ctx.command_path} --help` for details)")
    return "\n".join(lines) + "\n"


class RootGroup(PlainGroup):
    """The ``ezflow`` group: plain help, and every error in ezflow's style (the
    parser's included), whether run as the command or through typer's test runner."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            # Not standalone: the parser's errors come here instead of being printed
            # in click's style; typer.Exit (and Ctrl-C, 130) return their status.
            status = super().main(args, prog_name, complete_var, False, **extra)
        except UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `ezflow` alone: the help
                exc.show()
            else:
                sys.stderr.write(usage_error(exc))
            _exit(exc.exit_code)
        except ClickException as exc:
            sys.stderr.write(f"error: {_sentence(exc.format_message())}\n")
            _exit(exc.exit_code)
        except typer.Abort:
            sys.stderr.write("error: aborted\n")
            _exit(1)
        _exit(status if isinstance(status, int) and not isinstance(status, bool) else 0)


def _exit(status: int) -> NoReturn:
    sys.stdout.flush()
    sys.exit(status)
