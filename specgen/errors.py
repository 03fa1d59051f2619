"""The one exception type that the CLI turns into a one-line message and exit status 2,
and the one way specgen warns about something it worked around."""

import sys
import unicodedata

_warned: set[str] = set()


class SpecError(ValueError):
    """Bad input: an unknown shape, a malformed spec, or a variant that cannot fit.

    The message is a single line that says what was asked, which limit it breaks,
    and what to choose instead.
    """


def warn_once(key: str, message: str) -> None:
    """One line on stderr, once per process for each ``key``: a degraded cache or a
    skipped database line must be visible, and must not drown the output."""
    if key in _warned:
        return
    _warned.add(key)
    print(f"warning: {message}", file=sys.stderr)


def one_line(message: str) -> str:
    """Text as one printable line: every control character and line or paragraph
    separator escaped (the user's own text, a file's, may hold any of them)."""
    return "".join(
        (
            c.encode("unicode_escape").decode()
            if unicodedata.category(c)[0] in "CZ" and c != " "
            else c
        )
        for c in str(message)
    )
