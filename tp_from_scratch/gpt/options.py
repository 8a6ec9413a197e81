"""Command-line checks shared by every entry point (trainers, generate, convert, the planner).

One rule per kind of flag, one sentence per problem, so the same flag is refused with the same
words wherever it appears. Each rule returns the problem as a sentence, or None when the value
is fine; ``first_problem`` picks the first; ``parse_valid_args`` parses, checks and exits.
"""
import json
import os
import sys
from pathlib import Path


def at_least(flag, value, lowest):
    """``--steps must be at least 1, got 0``; None when value is None (flag not given)."""
    if value is None or value >= lowest:
        return None
    return f"{flag} must be at least {lowest}, got {value}"


def positive(flag, value):
    """A size, a degree or a count: an integer of 1 or more."""
    return at_least(flag, value, 1)


def greater_than_zero(flag, value):
    """A temperature, a timeout, a learning rate: a number strictly above 0."""
    if value is None or value > 0:
        return None
    return f"{flag} must be greater than 0, got {value}"


def divides(flag, value, total, what):
    """``--tp 3 does not divide the 4 heads``: value must divide total."""
    if value is None or value < 1 or total % value == 0:
        return None
    return f"{flag} {value} does not divide {what} ({total})"


def existing_path(flag, path):
    """The file or directory a flag names must exist."""
    if path is None or Path(path).exists():
        return None
    return f"{flag} {path}: no such file or directory"


def _file_above(path):
    """The first directory above ``path`` that exists as a file (so nothing can be created there)."""
    return next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)


def file_to_write(flag, path):
    """A file a flag will write (its missing directories created): not an existing directory,
    and no file where one of its directories must be."""
    if path is None:
        return None
    if Path(path).is_dir():
        return f"{flag} {path} is a directory, not a file to write"
    if _file_above(path):
        return f"{flag} {path}: {_file_above(path)} is a file, not a directory"
    return None


def directory_to_write(flag, path):
    """A directory a flag will write into (created if missing): neither it nor one of the
    directories above it an existing file."""
    if path is None:
        return None
    if Path(path).exists() and not Path(path).is_dir():
        return f"{flag} {path} is a file, not a directory to write into"
    if _file_above(path):
        return f"{flag} {path}: {_file_above(path)} is a file, not a directory"
    return None


def json_file(flag, path):
    """(the parsed JSON, None) or (None, a sentence naming the file and what is wrong)."""
    problem = existing_path(flag, path)
    if problem:
        return None, problem
    try:
        return json.loads(Path(path).read_text()), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{flag} {path}: not a readable JSON file ({e})"


def first_problem(*problems):
    """The first sentence among the rules' results, or None if every rule passed."""
    return next((p for p in problems if p), None)


def parse_valid_args(parser, validate_fn, argv=None, world=None):
    """Parse the command line and check it with ``validate_fn(args, world)`` (a message or None).

    On a problem, rank 0 prints the usage and the message and every rank exits with status 2
    (so a bad flag stops a torchrun job once, not once per rank), before any work is done.
    """
    args = parser.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    problem = validate_fn(args, world)
    if problem:
        if int(os.environ.get("RANK", "0")) == 0:
            parser.error(problem)  # prints usage and the message, exits with status 2
        sys.exit(2)
    return args
