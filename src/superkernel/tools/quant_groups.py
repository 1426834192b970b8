"""The group size a grouped quantization scheme (int4-weight) uses on a model: chosen for the user to divide every
layer's input width, or the user's own refused in one line naming the widths and the sizes that fit.

A size that does not divide a layer's input width would leave that layer float (SmolLM2-135M: 576-wide inputs,
the default 128 left most of the model float); this never happens silently.

A model read from a GGUF file whose weights are 4-bit in blocks of 32 (Q4_0, Q4_1, IQ4_NL; the K-quants' Q4_K
sub-blocks) is requantized on that grid when 32 fits: int4 with a float scale and zero point per 32 holds a Q4_1
block exactly, so the requantized model is the file's own (SmolLM2-135M's Q4_1, head int8, 259 tokens of the
shipped text: mean KL to the dequantized file 1e-3 at group 32, 0.28 at the 64 the widths would choose). Where the file gives no such grid the
largest size is chosen (fewer scales to read: our int4 GEMV at 32 takes 1.0-1.15x its time at 128 on an AVX2
core, Qwen2-0.5B's shapes).
"""

from __future__ import annotations

from superkernel.runtime.quant_schemes import Scheme

#: the attribute the model loader sets on a model read from a GGUF file: the file's type (``Q4_1``, ``F16``, ...)
GGUF_TYPE_TAG = "_superkernel_gguf_file_type"
#: GGUF file types whose weights are 4-bit in blocks (or sub-blocks) of 32: int4 at group 32 is on their grid
GRID_32_TYPES = ("Q4_0", "Q4_1", "IQ4_NL", "Q4_K_S", "Q4_K_M")


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


def choose(row: Scheme, widths: dict[str, int], asked: int | None, source: str | None = None) -> tuple[int, str]:
    """``(group size, how it was chosen)`` for the layers ``widths`` (name -> input features) of scheme ``row``.

    ``asked`` None: 32 when ``source`` (the GGUF file type the model was read from) is one of
    :data:`GRID_32_TYPES` and 32 divides every width, else the first of ``row.auto_groups`` that divides every
    width. A size that does not divide them all, or none that does: :class:`GroupSizeError`, one line with the
    widths and the sizes that fit.
    """
    fits = fitting(row, widths)
    if asked is None and source in GRID_32_TYPES and 32 in fits and row.auto_groups != (32,):
        return 32, f"chosen: the GGUF file's {source} blocks of 32 (int4 on the file's own grid)"
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


__all__ = ["GGUF_TYPE_TAG", "GRID_32_TYPES", "GroupSizeError", "choose", "fitting"]
