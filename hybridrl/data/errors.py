"""The error every data problem raises: a file or row that cannot be used."""


class DataError(ValueError):
    """A data file or row that cannot be used; the message names the file (and row or line) and the fix.

    The CLI prints it as one line and exits with status 2 (a user error, not a bug).
    """


class DataFileNotFound(DataError, FileNotFoundError):
    """A data file that does not exist (also a FileNotFoundError, for callers that test for one)."""
