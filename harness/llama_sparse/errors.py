"""The one exception type the command line turns into a clean message and exit code."""


class UserError(Exception):
    """A problem the user can fix; printed without a traceback, exit code 2."""

    exit_code = 2
