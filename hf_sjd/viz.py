"""Pictures of how an image was decoded: ``out.stats.commit_map`` drawn on the model's token grid.

:func:`commit_map` draws one generated image, the forward that committed each grid cell and how each cell was won
(:data:`hf_sjd.jacobi.stats.CommitMap.KINDS`; the runs phrase verification accepted jointly outlined), as SJD
(arXiv 2410.01699) and SJD-PV (arXiv 2603.06666) argue; :func:`compare` draws several outputs as the rows of one
figure on one colour scale; :func:`cell_maps` is the data, without matplotlib. Any adapter with a token grid works.
The drawing functions need matplotlib (the ``bench`` and ``test`` extras) and build a ``matplotlib.figure.Figure``
without pyplot (no global state): a notebook shows it; elsewhere ``fig.savefig(path)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .adapters import ImageGenerationAdapter, TokenGrid, detect_adapter
from .jacobi.stats import CommitMap, TokenKind

#: colour of each kind (CommitMap.KINDS order): accepted, recovered, bonus, sibling, phrase
KIND_COLOURS = ("#4daf4a", "#e41a1c", "#ffbf00", "#984ea3", "#377eb8")


def _adapter(adapter) -> ImageGenerationAdapter:
    if isinstance(adapter, ImageGenerationAdapter):
        return adapter
    if isinstance(adapter, torch.nn.Module):
        return getattr(adapter, "sjd_adapter", None) or detect_adapter(adapter)
    raise ValueError(f"adapter must be a model adapter (model.sjd_adapter, hf_sjd.adapters.detect_adapter(model)) or "
                     f"the model itself, got {type(adapter).__name__}")


def _commit_map(out) -> CommitMap:
    stats = getattr(out, "stats", None)
    commit = getattr(stats, "commit_map", None)
    if not isinstance(commit, CommitMap):
        raise ValueError(f"out must be what model.generate(..., custom_generate=<a Jacobi strategy>, "
                         f"return_dict_in_generate=True) returns (its stats.commit_map), got {type(out).__name__}")
    return commit


def _check_row(row, batch: int) -> int:
    if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < batch:
        raise ValueError(f"row must be an int in 0..{batch - 1} (the batch has {batch} row(s)), got {row!r}")
    return row


def token_grid(adapter, sequences: torch.Tensor) -> TokenGrid:
    """The :class:`~hf_sjd.adapters.TokenGrid` of ``sequences`` [b, prompt + new tokens]: the adapter's ``grid``,
    or the one its ``generated_tokens`` reads off the sequences (Emu3, Lumina-mGPT: a grid per call)."""
    adapter = _adapter(adapter)
    grid = getattr(adapter, "grid", None)
    if grid is None and hasattr(adapter, "generated_tokens"):
        _, grid = adapter.generated_tokens(sequences)
    if grid is None:
        raise ValueError(f"the {adapter.family!r} adapter ({type(adapter.model).__name__}) has no token grid, so "
                         f"there is no image to draw the commit map on; out.stats.commit_map holds the same record "
                         f"per generated token ([batch, new tokens])")
    return grid


def cell_maps(out, adapter, row: int = 0) -> dict[str, torch.Tensor]:
    """The commit map of image ``row`` on its grid: ``forward``, ``kind``, ``slot`` [height, width] (as
    :class:`~hf_sjd.jacobi.stats.CommitMap`'s, per image-code cell) and ``run`` [height, width]: the index in
    ``commit_map.phrase_runs`` of the jointly accepted run the cell lies in, -1 elsewhere."""
    commit = _commit_map(out)
    row = _check_row(row, commit.forward.shape[0])
    grid = token_grid(adapter, out.sequences[row:row + 1])
    new_tokens = int((commit.kind[row] >= 0).sum())
    if new_tokens < grid.num_tokens:
        raise ValueError(f"row {row} has {new_tokens} generated tokens, but its grid ({grid.describe()}) needs "
                         f"{grid.num_tokens}: it is not a whole image")
    # [height, width] generated index of every image-code cell (end-of-line tokens and the trailer are skipped)
    index = torch.arange(grid.height)[:, None] * grid.row_stride + torch.arange(grid.width)
    run = torch.full((commit.forward.shape[1],), -1, dtype=torch.long)
    for number, (run_row, first, length, _) in enumerate(commit.phrase_runs.tolist()):
        if run_row == row:
            run[first:first + length] = number
    return {"forward": commit.forward[row][index], "kind": commit.kind[row][index].long(),
            "slot": commit.slot[row][index], "run": run[index]}


def _picture(out, adapter, row: int, image, decode_kwargs: dict):
    """The decoded image of ``row`` (``image=None``), the one given, or None (``image=False``)."""
    if image is not None:
        return None if image is False else image
    try:
        return _adapter(adapter).decode_images(out.sequences[row:row + 1], **decode_kwargs)[0]
    except (NotImplementedError, ValueError, FileNotFoundError) as error:
        raise ValueError(f"cannot decode the image to draw next to the maps ({error}); pass image=False to draw the "
                         f"maps alone, or image=<a PIL image>") from error


def _outline_runs(axis, run: torch.Tensor) -> None:
    """Outline each jointly accepted run (cells with one ``run`` label) on ``axis``."""
    from matplotlib.collections import LineCollection

    label = torch.nn.functional.pad(run, (1, 1, 1, 1), value=-1)  # [h+2, w+2]
    left, right = label[1:-1, :-1], label[1:-1, 1:]  # an edge left of cell (i, j) / above it, where the labels
    above, below = label[:-1, 1:-1], label[1:, 1:-1]  # either side differ and one side is a run
    segments = [[(j - 0.5, i - 0.5), (j - 0.5, i + 0.5)]
                for i, j in ((left != right) & ((left >= 0) | (right >= 0))).nonzero().tolist()]
    segments += [[(j - 0.5, i - 0.5), (j + 0.5, i - 0.5)]
                 for i, j in ((above != below) & ((above >= 0) | (below >= 0))).nonzero().tolist()]
    axis.add_collection(LineCollection(segments, colors="black", linewidths=1.2))


def _draw_row(figure, axes, maps: dict, picture, title: str, vmax: int) -> None:
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    axes = list(axes)
    if picture is not None:
        image_axis = axes.pop(0)
        image_axis.imshow(picture)
        image_axis.set_title(title, fontsize=8)
    forward_axis, kind_axis = axes
    heat = forward_axis.imshow(maps["forward"].numpy(), cmap="viridis", vmin=0, vmax=max(vmax, 1))
    forward_axis.set_title("forward that committed the cell" if picture is not None
                           else f"{title}\nforward that committed the cell", fontsize=8)
    figure.colorbar(heat, ax=forward_axis, fraction=0.046, pad=0.04)
    colours = ListedColormap(KIND_COLOURS)
    kind_axis.imshow(maps["kind"].numpy(), cmap=colours,
                     norm=BoundaryNorm(torch.arange(len(KIND_COLOURS) + 1).sub(0.5).tolist(), len(KIND_COLOURS)))
    phrases = bool((maps["run"] >= 0).any())
    if phrases:
        _outline_runs(kind_axis, maps["run"])
    kind_axis.set_title("how the cell was won" + (" (phrases outlined)" if phrases else ""), fontsize=8)
    present = sorted(set(maps["kind"].flatten().tolist()) - {-1})
    kind_axis.legend(handles=[Patch(color=KIND_COLOURS[k], label=CommitMap.KINDS[k]) for k in present],
                     loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=7, frameon=False)
    for axis in (forward_axis, kind_axis, *([image_axis] if picture is not None else [])):
        axis.set_xticks([]), axis.set_yticks([])


def _summary(out, row: int) -> str:
    stats = out.stats
    forwards = int(stats.row_forward_passes[row]) if len(stats.row_forward_passes) else stats.num_forward_passes
    return f"{forwards} forwards, {float(stats.row_step_compression[row]):.2f} tokens/forward"


def commit_map(out, adapter, row: int = 0, image=None, title: str | None = None, **decode_kwargs):
    """One generated image's commit map (a ``Figure``: the image, the forward that committed each cell, how it
    was won). ``out``: ``model.generate(..., custom_generate=<strategy>, return_dict_in_generate=True)``;
    ``adapter``: ``model.sjd_adapter`` or the model; ``row``: the image of the batch; ``image``: None decodes it
    (``decode_kwargs`` go to ``adapter.decode_images``), False leaves it out, or a PIL image; ``title``: above
    the row (default: forwards and tokens per forward)."""
    _check_row(row, _commit_map(out).forward.shape[0])  # before the title reads the row's counters
    return compare({title if title is not None else _summary(out, row): out}, adapter, row=row,
                   images=None if image is None else [image], **decode_kwargs)


def compare(outputs, adapter, row: int = 0, images=None, **decode_kwargs):
    """Several outputs' commit maps (e.g. ``sjd``, ``mc-sjd``, ``sjd-pv`` on one prompt and seed) as the rows of
    one figure, on one colour scale. ``outputs``: a mapping name -> output, or a sequence of outputs; ``images``:
    None decodes each, False leaves them out, or one PIL image per output. The rest as in :func:`commit_map`."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("hf_sjd.viz draws with matplotlib, which is not installed: pip install matplotlib "
                          "(or pip install 'hf_sjd[bench]')") from error
    if isinstance(outputs, Mapping):
        named = list(outputs.items())
    elif isinstance(outputs, Sequence) and not isinstance(outputs, (str, bytes)):
        named = [(None, out) for out in outputs]
    else:
        raise ValueError(f"outputs must be a mapping name -> generate output or a sequence of outputs, got "
                         f"{type(outputs).__name__}")
    if not named:
        raise ValueError("outputs is empty: pass at least one generate output")
    if images is not None and images is not False and (not isinstance(images, Sequence) or len(images) != len(named)):
        raise ValueError(f"images must be None (decode), False (no pictures) or one image per output "
                         f"({len(named)}), got {images!r}")
    rows = []
    for number, (name, out) in enumerate(named):
        maps = cell_maps(out, adapter, row)
        given = images if images is None or images is False else images[number]
        picture = _picture(out, adapter, row, given, decode_kwargs)
        summary = _summary(out, row)
        title = summary if name is None else (name if name == summary else f"{name}: {summary}")
        rows.append((maps, picture, title))
    columns = 2 + any(picture is not None for _, picture, _ in rows)
    vmax = max(int(maps["forward"].max()) for maps, _, _ in rows)
    figure = Figure(figsize=(3.3 * columns, 2.9 * len(rows)), layout="constrained")
    grid = figure.subplots(len(rows), columns, squeeze=False)
    for axes, (maps, picture, title) in zip(grid, rows):
        if picture is None and columns == 3:
            axes[0].set_axis_off()
            axes = axes[1:]
        _draw_row(figure, axes, maps, picture, title, vmax)
    return figure


__all__ = ["KIND_COLOURS", "TokenKind", "cell_maps", "commit_map", "compare", "token_grid"]
