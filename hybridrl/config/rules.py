"""Range rules a key declares beside its field: `option(default, doc, check=AT_LEAST_1)`.

A rule is a predicate and the words a message uses when it fails ("must be >= 1"); the checker
(`validate._range_problems`) skips a None value (an optional key left unset) and suggests the
key's default as the fix.
"""

from typing import Any, Callable, NamedTuple


class Rule(NamedTuple):
    ok: Callable[[Any], bool]
    text: str  # what the value must be, e.g. "must be >= 1"


AT_LEAST_1 = Rule(lambda v: v >= 1, "must be >= 1")
AT_LEAST_0 = Rule(lambda v: v >= 0, "must be >= 0")
POSITIVE = Rule(lambda v: v > 0, "must be > 0")
UNIT = Rule(lambda v: 0 <= v <= 1, "must be between 0 and 1")
PROB = Rule(lambda v: 0 < v <= 1, "must be in (0, 1]")
OFF_OR_1 = Rule(lambda v: v == -1 or v >= 1, "must be -1 (off) or >= 1")
OFF_OR_0 = Rule(lambda v: v >= -1, "must be -1 (off) or >= 0")
THREADS = Rule(lambda v: v >= -1, "must be -1 (torch's default), 0 (auto) or a thread count >= 1")
BELOW_1 = Rule(lambda v: v < 1, "must be < 1")
ROLLOUT_DEVICES = Rule(lambda v: v == "auto" or (isinstance(v, int) and v >= 1), "must be >= 1, or auto")
BETAS = Rule(lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "must be two numbers in [0, 1)")
