"""The exceptions the command line turns into a clean message and exit code.

A `UserError` that reaches a gate means the gate cannot run (no build, no model, a bad gate
file): it stops the gate. An `ArmError` is one arm's failure (its server died or timed out, or
answered in a form the gate cannot use): the gate records it as that arm's error, never as a
score, and goes on with the other arms.
"""


class UserError(Exception):
    """A problem the user can fix; printed without a traceback, exit code 2."""

    exit_code = 2


class ArmError(UserError):
    """One arm of a gate failed; the message says how, with the server's log tail where there is one."""
