"""Errors shared across the package."""


class UserError(Exception):
    """A mistake the user can fix (bad config, missing binary, unknown model).
    The CLI prints it as one line, without a traceback."""


def config_key_error(key: str, why: str) -> UserError:
    """The one-line error for a bad value of config key `key` (e.g. 'redis.url')."""
    return UserError(f"config key '{key}': {why}")
