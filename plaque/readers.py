"""Ready-made partitioned input: text and Parquet files cut into parts a run's source shards
read.

``text_parts(paths, n)`` cuts text files into ``n`` parts of about equal size, each a tuple of
``(path, start, stop)`` byte ranges that begin and end at line boundaries, so every line is in
exactly one part; it only seeks and reads a little around each cut, so the driver never reads
the input. Give them to a run (``installed.run(arg, parts={"src": text_parts(files, n)})``) and
each source shard reads its own with ``read_lines(ctx.part)`` on the worker that hosts it.

>>> parts = text_parts(["a.txt", "b.txt"], 4)       # one part per shard of "src"
>>> for line in read_lines(parts[0]):                # on the worker of shard 0
...     ...

``parquet_parts(paths, n)`` does the same for Parquet files by row groups (the driver reads
only each file's footer), and ``read_parquet(part, columns)`` yields a part's row groups as
``pyarrow.Table`` objects on the worker; both need pyarrow (``pip install
'pathways-open[parquet]'``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

__all__ = ["parquet_parts", "read_lines", "read_parquet", "text_parts"]

SCAN = 1 << 16  # bytes read at a time while looking for the end of a line


def text_parts(paths, n: int) -> list[tuple]:
    """``n`` parts of the files ``paths`` (one path or a sequence of them), in order; part
    ``i`` is a tuple of ``(path, start, stop)`` byte ranges (possibly empty), cut at the
    starts of lines, of about ``total / n`` bytes each."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    sizes = []
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no file at {os.fspath(path)!r}")
        sizes.append(os.path.getsize(path))
    total = sum(sizes)
    cuts = [_line_start(paths, sizes, total * k // n) for k in range(1, n)]
    bounds = [(0, 0), *cuts, (len(paths), 0)]  # (file index, offset) of each part's start
    return [_ranges(paths, sizes, a, b) for a, b in zip(bounds, bounds[1:])]


def parquet_parts(paths, n: int) -> list[tuple]:
    """``n`` parts of the Parquet files ``paths`` (one path or a sequence), in order: part
    ``i`` is a tuple of ``(path, row group)`` pairs, contiguous, of about ``rows / n`` rows
    each (whole row groups, so with fewer row groups than parts some parts are empty)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    pq = parquet_module()
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    groups = []  # (path, row group, rows)
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no file at {os.fspath(path)!r}")
        meta = pq.ParquetFile(path).metadata
        groups.extend((os.fspath(path), g, meta.row_group(g).num_rows)
                      for g in range(meta.num_row_groups))
    total = sum(rows for _, _, rows in groups)
    parts: list[list] = [[] for _ in range(n)]
    seen = 0
    for path, g, rows in groups:  # a row group goes to the part its middle row falls in
        middle = seen + rows / 2
        parts[min(n - 1, int(middle * n / total)) if total else 0].append((path, g))
        seen += rows
    return [tuple(p) for p in parts]


def read_parquet(part: Sequence, columns=None) -> Iterator:
    """The row groups of ``part`` (from ``parquet_parts``), in order, each a
    ``pyarrow.Table`` (only ``columns``, if given)."""
    pq = parquet_module()
    opened: dict = {}
    for path, group in part:
        f = opened.get(path)
        if f is None:
            f = opened[path] = pq.ParquetFile(path)
        yield f.read_row_group(group, columns=columns)


def parquet_module():
    """``pyarrow.parquet``, or an ImportError saying how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("Parquet needs pyarrow: pip install 'pathways-open[parquet]'") \
            from None
    return pq


def read_lines(part: Sequence) -> Iterator[str]:
    """The lines of ``part`` (from ``text_parts``), in order, as ``str.splitlines`` gives
    them (UTF-8, without their line ends)."""
    for path, start, stop in part:
        if stop <= start:
            continue
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(stop - start)
        yield from data.decode("utf-8").splitlines()


def _line_start(paths, sizes, at: int) -> tuple[int, int]:
    """(file index, offset) of the first line start at or after byte ``at`` of all files
    laid end to end: the byte after the next newline, or the start of the next file."""
    i = 0
    while i < len(sizes) and at >= sizes[i]:
        at -= sizes[i]
        i += 1
    if i == len(sizes) or at == 0:
        return i, at
    with open(paths[i], "rb") as f:
        f.seek(at - 1)  # a cut right after a newline is a line start already
        offset = at - 1
        while True:
            chunk = f.read(SCAN)
            if not chunk:
                return i + 1, 0  # no newline left in this file: the next one starts a line
            found = chunk.find(b"\n")
            if found >= 0:
                start = offset + found + 1
                return (i, start) if start < sizes[i] else (i + 1, 0)
            offset += len(chunk)


def _ranges(paths, sizes, a: tuple[int, int], b: tuple[int, int]) -> tuple:
    """The byte ranges from position ``a`` up to position ``b`` (both (file, offset))."""
    if b <= a:
        return ()
    out = []
    for i in range(a[0], min(b[0], len(paths) - 1) + 1):
        start = a[1] if i == a[0] else 0
        stop = b[1] if i == b[0] else sizes[i]
        if stop > start:
            out.append((os.fspath(paths[i]), start, stop))
    return tuple(out)
