"""Checking the error messages of fuseops' argument checks."""

from __future__ import annotations

import pytest


def expect_error_mentions(call, fragments) -> None:
    """Expects `call()` to raise a RuntimeError whose message contains every
    one of `fragments` (the op's name, the argument's name, what is wrong)."""
    with pytest.raises(RuntimeError) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value)
