"""Errors shared across the package."""


class UserError(Exception):
    """A mistake the user can fix (bad config, missing binary, unknown model).
    The CLI prints it as one line, without a traceback."""
