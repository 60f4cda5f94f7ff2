"""Errors a user can cause. The CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """Bad input from the user: a path, a file, a flag, a prompt. Never a bug of ours."""
