"""The ground floor: the one base class of every error a user can cause and fix. Imports nothing.

Stages catch `VlbenchError` and print its message as one line (no traceback); each subclass lives beside the
code that raises it and its message names the file, sample, key or option at fault.
"""


class VlbenchError(ValueError):
    """A problem with the user's params, data, weights or cached artifacts; the message says which and how to fix it."""
