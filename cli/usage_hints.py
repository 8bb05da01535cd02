"""What the command line adds to argparse's usage errors: a did-you-mean for a mistyped option or
command, and how to pass a flag that starts with `--` as a value (`--extra-flag=--x=1`).

Kept apart from the parser class (cli/__init__.py) so the rules read on their own; they only
look at the parser's option strings and the tokens it was given.
"""
from __future__ import annotations

import argparse
import difflib
import re
from typing import Sequence

# Options whose value is itself a flag of vLLM's, so it must be joined with "=".
_FLAG_VALUED = ("--extra-flag",)


def _choices(parser: argparse.ArgumentParser) -> list[str]:
    return [s for s in parser._option_string_actions if s.startswith("--")]   # noqa: SLF001 (argparse's own table)


def _known(parser: argparse.ArgumentParser, name: str) -> bool:
    options = parser._option_string_actions                                  # noqa: SLF001
    if name in options:
        return True
    # argparse takes an unambiguous prefix of a long option (allow_abbrev)
    return name.startswith("--") and parser.allow_abbrev and sum(o.startswith(name) for o in options) == 1


def unknown_options(parser: argparse.ArgumentParser, tokens: Sequence[str]) -> list[str]:
    """The tokens that look like options this parser does not have (`--promt`)."""
    out = []
    for i, token in enumerate(tokens):
        if token == "--":
            break
        if not token.startswith("-") or re.fullmatch(r"-\d[\d.eE+-]*", token) or token == "-":
            continue
        if i > 0 and tokens[i - 1] in _FLAG_VALUED:
            continue              # the value of --extra-flag (told apart in `hints`)
        name = token.split("=", 1)[0]
        if not _known(parser, name):
            out.append(token)
    return out


def hints(parser: argparse.ArgumentParser, message: str, tokens: Sequence[str], unknown: Sequence[str]) -> list[str]:
    """Lines that say what to type instead, for this usage error."""
    out: list[str] = []
    for flag in _FLAG_VALUED:
        if message.startswith(f"argument {flag}:") and "expected one argument" in message:
            values = [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == flag and tokens[i + 1].startswith("-")]
            example = f"{flag}={values[0]}" if values else f"{flag}=--max-num-seqs=2"
            out.append(f"a value that starts with '-' must be joined to {flag} with '=': write {example}")
    for token in unknown:
        name = token.split("=", 1)[0]
        near = difflib.get_close_matches(name, _choices(parser), n=1, cutoff=0.6)
        if near:
            out.append(f"did you mean {near[0]}{token[len(name):]}?")
    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if m:
        choices = re.findall(r"'([^']*)'", m.group(2))
        near = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
        if near:
            out.append(f"did you mean {near[0]}?")
    return out
