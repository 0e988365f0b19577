"""The one exception type of xprof-lite, so callers can catch everything it raises."""


class Error(Exception):
    """Raised on bad input to xprof-lite; the message names the bad value and the fix."""
