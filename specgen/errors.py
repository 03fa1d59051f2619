"""The one exception type that the CLI turns into a one-line message and exit status 2."""


class SpecError(ValueError):
    """Bad input: an unknown shape, a malformed spec, or a variant that cannot fit.

    The message is a single line that says what was asked, which limit it breaks,
    and what to choose instead.
    """
