"""The one exception type the CLI turns into a one-line message and a non-zero exit."""


class LlogosError(Exception):
    """A problem with the user's input or environment, explained in one line."""
