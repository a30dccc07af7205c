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

Each entry of a part records its file's size and modification time (ns) when the parts were
made (``Stamped``), and a reader refuses a file that no longer matches: a file rewritten,
truncated or grown between planning and reading would otherwise be read short or shifted,
silently. Every error a reader meets is a ``SourceError`` naming the file and the byte or row
group, its message kept short (the original is chained). An empty listing is refused unless
``allow_empty=True``: most often it is a glob that matched nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from .errors import SourceError

__all__ = ["parquet_parts", "read_lines", "read_parquet", "text_parts"]

SCAN = 1 << 16  # bytes read at a time while looking for the end of a line
DETAIL = 200  # characters of an inner error's message a SourceError keeps


class Stamped(tuple):
    """A part's entry, ``(path, start, stop)`` or ``(path, row group)``, carrying its file's
    ``size`` and ``mtime_ns`` when the parts were made. A plain tuple to code that unpacks or
    compares it, so the documented shapes hold; the readers check the file against the
    stamp."""

    def __new__(cls, items, size: int, mtime_ns: int):
        self = super().__new__(cls, items)
        self.size, self.mtime_ns = size, mtime_ns
        return self

    def __reduce__(self):  # a tuple subclass pickles its items only; keep the stamp
        return (Stamped, (tuple(self), self.size, self.mtime_ns))


def text_parts(paths, n: int, allow_empty: bool = False) -> list[tuple]:
    """``n`` parts of the files ``paths`` (one path or a sequence of them), in order; part
    ``i`` is a tuple of ``(path, start, stop)`` byte ranges (possibly empty), cut at the
    starts of lines, of about ``total / n`` bytes each. No files is a ValueError unless
    ``allow_empty`` (then every part is empty)."""
    _check_n(n)
    paths = _listing(paths, allow_empty)
    stats = [os.stat(path) for path in paths]  # before reading: a later change is caught
    sizes = [st.st_size for st in stats]
    total = sum(sizes)
    cuts = [_line_start(paths, sizes, total * k // n) for k in range(1, n)]
    bounds = [(0, 0), *cuts, (len(paths), 0)]  # (file index, offset) of each part's start
    return [_ranges(paths, stats, a, b) for a, b in zip(bounds, bounds[1:])]


def parquet_parts(paths, n: int, allow_empty: bool = False) -> list[tuple]:
    """``n`` parts of the Parquet files ``paths`` (one path or a sequence), in order: part
    ``i`` is a tuple of ``(path, row group)`` pairs, contiguous, of about ``rows / n`` rows
    each (whole row groups, so with fewer row groups than parts some parts are empty). No
    files is a ValueError unless ``allow_empty``; a file that is not Parquet a SourceError."""
    _check_n(n)
    pa, pq = pyarrow_modules()
    groups = []  # (entry, rows)
    for path in _listing(paths, allow_empty):
        pf, f, st = _open_parquet(pa, pq, os.fspath(path), None, "its footer")
        with f:
            meta = pf.metadata
            groups.extend((Stamped((os.fspath(path), g), st.st_size, st.st_mtime_ns),
                           meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
    total = sum(rows for _, rows in groups)
    parts: list[list] = [[] for _ in range(n)]
    seen = 0
    for entry, rows in groups:  # a row group goes to the part its middle row falls in
        middle = seen + rows / 2
        parts[min(n - 1, int(middle * n / total)) if total else 0].append(entry)
        seen += rows
    return [tuple(p) for p in parts]


def read_parquet(part: Sequence, columns=None) -> Iterator:
    """The row groups of ``part`` (from ``parquet_parts``), in order, each a
    ``pyarrow.Table`` (only ``columns``, if given); SourceError if a file changed since the
    parts were made or cannot be read."""
    pa, pq = pyarrow_modules()
    opened: dict = {}  # path -> (ParquetFile, its open file)
    try:
        for entry in part:
            yield _read_group(pa, pq, opened, entry, columns)
    finally:
        for _, f in opened.values():
            f.close()


def _read_group(pa, pq, opened: dict, entry, columns):
    path, group = entry
    where = f"row group {group}"
    if path not in opened:
        pf, f, _ = _open_parquet(pa, pq, path, entry, where)
        opened[path] = (pf, f)
    pf, f = opened[path]
    count = pf.metadata.num_row_groups
    if not 0 <= group < count:
        raise SourceError(path, f"has {count} row groups", where)
    try:
        table = pf.read_row_group(group, columns=columns)
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(path, _detail("cannot read it", exc), where) from exc
    _check_unchanged(path, entry, os.fstat(f.fileno()), where)  # not rewritten meanwhile
    return table


def _open_parquet(pa, pq, path: str, entry, where: str):
    """``(ParquetFile, open file, its stat)`` of ``path``, checked against ``entry``'s stamp
    (if it has one); SourceError if it cannot be opened, changed, or is not Parquet."""
    try:
        f = pa.OSFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(path, _detail("cannot open it", exc), where) from exc
    try:
        st = os.fstat(f.fileno())  # the file read below, whatever the path names meanwhile
        _check_unchanged(path, entry, st, where)
        return pq.ParquetFile(f), f, st
    except (OSError, pa.ArrowException) as exc:
        f.close()
        raise SourceError(path, _detail("not a Parquet file it can read", exc), where) \
            from exc
    except BaseException:
        f.close()
        raise


def pyarrow_modules():
    """``(pyarrow, pyarrow.parquet)``, or an ImportError saying how to install them."""
    pq = parquet_module()
    import pyarrow as pa

    return pa, pq


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
    them (UTF-8, without their line ends); SourceError if a file changed since the parts
    were made, is shorter than its range, or is not UTF-8 there."""
    for entry in part:
        path, start, stop = entry
        if stop <= start:
            continue
        data = _read_range(entry)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceError(path, f"not UTF-8 text ({exc.reason})",
                              f"byte {start + exc.start}") from exc
        yield from text.splitlines()


def _read_range(entry) -> bytes:
    """The bytes of ``entry`` (``(path, start, stop)``), all of them, from the file its
    stamp (if any) describes."""
    path, start, stop = entry
    where = f"byte {start}"
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(stop - start)
            # after the read: a change before or while reading shows in it
            _check_unchanged(path, entry, os.fstat(f.fileno()), where)
    except OSError as exc:
        raise SourceError(path, _detail("cannot read it", exc), where) from exc
    if len(data) < stop - start:
        raise SourceError(path, f"ends at byte {start + len(data)}, before its part's end"
                          f" {stop}: it is shorter than when its parts were made", where)
    return data


def _check_unchanged(path: str, entry, st, where: str) -> None:
    """SourceError if the file's stat ``st`` is not what ``entry`` recorded at planning (an
    entry made by hand, a plain tuple, records nothing)."""
    size, mtime = getattr(entry, "size", None), getattr(entry, "mtime_ns", None)
    if size is None or (st.st_size, st.st_mtime_ns) == (size, mtime):
        return
    raise SourceError(path, f"changed since its parts were made (size {size} -> {st.st_size}"
                      f" bytes, mtime_ns {mtime} -> {st.st_mtime_ns}): make the parts again",
                      where)


def _detail(what: str, exc: BaseException) -> str:
    """``what`` and ``exc``'s message, cut to DETAIL characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > DETAIL:
        text = text[:DETAIL - 3] + "..."
    return f"{what}: {type(exc).__name__}: {text}"


def _check_n(n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")


def _listing(paths, allow_empty: bool) -> list:
    """``paths`` (one path or a sequence) as a list of existing files."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths and not allow_empty:
        raise ValueError("no input files: the listing is empty (a glob or directory that"
                         " matched nothing?); pass allow_empty=True to make empty parts")
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no file at {os.fspath(path)!r}")
    return paths


def _line_start(paths, sizes, at: int) -> tuple[int, int]:
    """(file index, offset) of the first line start at or after byte ``at`` of all files
    laid end to end: the byte after the next newline, or the start of the next file."""
    i = 0
    while i < len(sizes) and at >= sizes[i]:
        at -= sizes[i]
        i += 1
    if i == len(sizes) or at == 0:
        return i, at
    try:
        return _next_line(paths[i], sizes[i], i, at)
    except OSError as exc:
        raise SourceError(os.fspath(paths[i]), _detail("cannot read it", exc), f"byte {at}") \
            from exc


def _next_line(path, size: int, i: int, at: int) -> tuple[int, int]:
    """(file index, offset) of the first line start at or after byte ``at`` of file ``i``
    (``path``, of ``size`` bytes), or of the next file."""
    with open(path, "rb") as f:
        f.seek(at - 1)  # a cut right after a newline is a line start already
        offset = at - 1
        while True:
            chunk = f.read(SCAN)
            if not chunk:
                return i + 1, 0  # no newline left in this file: the next one starts a line
            found = chunk.find(b"\n")
            if found >= 0:
                start = offset + found + 1
                return (i, start) if start < size else (i + 1, 0)
            offset += len(chunk)


def _ranges(paths, stats, a: tuple[int, int], b: tuple[int, int]) -> tuple:
    """The byte ranges from position ``a`` up to position ``b`` (both (file, offset)), each
    stamped with its file's ``stats``."""
    if b <= a:
        return ()
    out = []
    for i in range(a[0], min(b[0], len(paths) - 1) + 1):
        st = stats[i]
        start = a[1] if i == a[0] else 0
        stop = b[1] if i == b[0] else st.st_size
        if stop > start:
            out.append(Stamped((os.fspath(paths[i]), start, stop), st.st_size,
                               st.st_mtime_ns))
    return tuple(out)
