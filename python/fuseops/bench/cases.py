"""The benchmark's case registry: one small declarative entry per op, defined
by the op's own module (``fuseops.ops.cases.<module>.bench_cases()``, with the
types of ``fuseops.ops.cases._bench_case``, re-exported here) and collected here,
module by module in name order.

An entry names the fuseops function and its reference by attribute (looked up
at run time, so an op that is not in the installed build is reported as "not
built" instead of disappearing), says how to make inputs for a
``(rows, hidden)`` shape, which native PyTorch op is its peer, and how many
bytes the op must move at the least.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

from ..ops.cases._bench_case import (  # noqa: F401  (re-exported)
    EPS,
    InputMaker,
    TRAFFIC_METHOD,
    Traffic,
    TrafficModel,
    Case,
    row,
    vector,
    x,
    x_weight,
    x_residual_weight,
    x_weight_bias,
    x_bias,
    gate_up,
    packed,
)


def _collect() -> list[Case]:
    from .. import preference, trl
    from ..ops import cases

    # The op modules' cases, then those of the integrations built on them.
    return [
        replace(case, family=module.__name__.rsplit(".", 1)[-1])
        for module in (*cases.MODULES, preference, trl)
        for case in module.bench_cases()
    ]


CASES: list[Case] = _collect()


def by_name(names: Optional[Sequence[str]] = None, variants: bool = True) -> list[Case]:
    """The registered cases, in registry order, restricted to `names`; without
    names, all of them, or all but the variants."""
    if not names:
        return [case for case in CASES if variants or not case.variant]
    known = {case.name: case for case in CASES}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[name] for name in names]


def one_per_family() -> list[Case]:
    """The first case of each op family (module) that is not a variant, in
    registry order: the quick preset's selection."""
    chosen: dict[str, Case] = {}
    for case in CASES:
        if not case.variant:
            chosen.setdefault(case.family, case)
    return list(chosen.values())
