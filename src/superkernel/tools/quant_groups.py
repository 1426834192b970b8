"""The group size a grouped quantization scheme (int4-weight) uses on a model: chosen for the user to divide every
layer's input width, or the user's own refused in one line naming the widths and the sizes that fit.

A size that does not divide a layer's input width would leave that layer float (SmolLM2-135M: 576-wide inputs,
the default 128 left most of the model float); this never happens silently.
"""

from __future__ import annotations

from superkernel.runtime.quant_schemes import Scheme


class GroupSizeError(ValueError):
    """No group size the scheme takes divides every layer's input width, or the one given does not."""


def fitting(row: Scheme, widths: dict[str, int]) -> list[int]:
    """The scheme's group sizes that divide every width, largest first."""
    return [g for g in sorted(row.group_sizes, reverse=True) if all(w % g == 0 for w in widths.values())]


def _listing(widths: dict[str, int], group: int | None = None) -> str:
    """``576 (q_proj and 59 more), 1536 (down_proj ...)``: each width with a layer naming it, those ``group`` leaves."""
    by_width: dict[int, list[str]] = {}
    for name, width in widths.items():
        if group is None or width % group:
            by_width.setdefault(width, []).append(name)
    return ", ".join(f"{w} ({names[0]}" + (f" and {len(names) - 1} more)" if len(names) > 1 else ")")
                     for w, names in sorted(by_width.items()))


def choose(row: Scheme, widths: dict[str, int], asked: int | None) -> tuple[int, str]:
    """``(group size, how it was chosen)`` for the layers ``widths`` (name -> input features) of scheme ``row``.

    ``asked`` None: the first of ``row.auto_groups`` that divides every width. A size that does not divide them
    all, or none that does: :class:`GroupSizeError`, one line with the widths and the sizes that fit.
    """
    fits = fitting(row, widths)
    sizes = ", ".join(map(str, fits)) or "none"
    if asked is not None:
        if asked in fits:
            return asked, "given"
        raise GroupSizeError(f"{row.name}: group size {asked} does not divide the input width of every layer it "
                             f"quantizes ({_listing(widths, asked)}; all input widths: "
                             f"{', '.join(map(str, sorted(set(widths.values()))))}); group sizes that fit every "
                             f"layer: {sizes}")
    group = next((g for g in row.auto_groups if g in fits), None)
    if group is None:
        least = min(row.group_sizes)
        raise GroupSizeError(f"{row.name}: no group size of {', '.join(map(str, row.group_sizes))} divides every "
                             f"layer's input width (not even {least}: {_listing(widths, least)}); those layers "
                             "would stay float")
    widest = ", ".join(map(str, sorted(set(widths.values()))))
    if len(row.auto_groups) > 1:
        sizes = ", ".join(map(str, row.auto_groups))
        return group, f"chosen: the largest of {sizes} dividing every input width ({widest})"
    return group, f"chosen: the scheme's block of {group} divides every input width ({widest})"


__all__ = ["GroupSizeError", "choose", "fitting"]
