"""Versioned state, the pure part: which version of an entry a reader sees, and which versions may go.

The remote backend (runtime/state/remote.py) never overwrites an entry: every
write adds a field `version -> value` to the entry, where the version is a
number from the server's clock. A checkpoint is a version number (its *cut*),
so it copies nothing. What a reader of a key group sees is given by the
group's *lineage*: the version intervals that belong to its history. A fresh
writer's lineage is `[start, OPEN]`; a restore to cut `c` of a lineage `L`
makes the group's lineage `L clipped at c` plus `[new start, OPEN]`, so
versions written after the checkpoint (by this attempt or a zombie of an
older one) fall in a gap and are invisible without being touched: a restore
moves no data. A *view* is a lineage a reader may still use: the live
writer's, and each retained checkpoint's (clipped at its cut).

An entry's value in a view is its field of the largest version inside the
view's lineage (a tombstone hides older ones). Garbage collection keeps, for
each entry, only the fields some view sees; everything here is a plain
function of integers so that it is tested without a server.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

OPEN = (1 << 63) - 1  # the upper end of a live lineage: every version the writer will still allocate

Lineage = tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive [low, high] intervals


def fresh(start: int) -> Lineage:
    return ((start, OPEN),)


def clip(lineage: Lineage, cut: int) -> Lineage:
    """The lineage as a checkpoint taken at version `cut` sees it: nothing after the cut."""
    return tuple((low, min(high, cut)) for low, high in lineage if low <= cut)


def resume(lineage: Lineage, cut: int, start: int) -> Lineage:
    """After a restore to `cut`: the checkpoint's history, then the new writer's versions from `start`."""
    if start <= cut:
        raise ValueError(f"a restored writer must start after the cut ({start} <= {cut})")
    return (*clip(lineage, cut), (start, OPEN))


def contains(lineage: Lineage, version: int) -> bool:
    return any(low <= version <= high for low, high in lineage)


def visible(versions: Iterable[int], lineage: Lineage) -> int | None:
    """The version a reader of `lineage` sees among an entry's `versions` (None: the entry is absent)."""
    best = None
    for v in versions:
        if (best is None or v > best) and contains(lineage, v):
            best = v
    return best


def needed(versions: Iterable[int], views: Sequence[Lineage]) -> set[int]:
    """The versions of an entry that some view sees; the others can be deleted."""
    versions = list(versions)
    keep = set()
    for view in views:
        v = visible(versions, view)
        if v is not None:
            keep.add(v)
    return keep


def common(views: Sequence[Lineage]) -> Lineage:
    """The versions every view contains (the intersection of the lineages)."""
    if not views:
        return ()
    out = views[0]
    for view in views[1:]:
        out = tuple((max(a, c), min(b, d)) for a, b in out for c, d in view if max(a, c) <= min(b, d))
    return out


def settled(versions: Iterable[int], views: Sequence[Lineage]) -> bool:
    """True when collection can forget the entry until its next write.

    That is when one field is left and every view sees it: any later restore is
    to one of these views or to a later checkpoint of the live view, so no
    restore can turn the field dead, and only a new write adds a field.
    """
    versions = list(versions)
    return len(versions) == 1 and contains(common(views), versions[0])


def encode(lineage: Lineage) -> list[list[int]]:
    return [[low, high] for low, high in lineage]


def decode(data: Iterable[Sequence[int]]) -> Lineage:
    out = tuple((int(low), int(high)) for low, high in data)
    for (_, high), (low, _) in zip(out, out[1:], strict=False):
        if low <= high:
            raise ValueError(f"lineage intervals {out} overlap or are unsorted")
    return out
