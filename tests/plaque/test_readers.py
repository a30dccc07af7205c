"""``plaque.readers``: text files cut into line-aligned parts, every line in exactly one part,
in order; and a word count over files on disk whose source shards each read their own part."""

from __future__ import annotations

import collections
import os
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plaque
from plaque import KEYED, Graph, Operator
from plaque.readers import read_lines, text_parts

lines = st.lists(st.text(st.characters(blacklist_categories=("Cs",),
                                       blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85"
                                                            "\u2028\u2029"),
                         max_size=12), max_size=30)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(lines, st.booleans()), min_size=1, max_size=4),
       st.integers(1, 9))
def test_every_line_is_in_exactly_one_part_in_order(tmp_path_factory, files, n):
    where = tmp_path_factory.mktemp("text")
    paths, want = [], []
    for k, (file_lines, trailing) in enumerate(files):
        text = "\n".join(file_lines) + ("\n" if trailing and file_lines else "")
        path = where / f"f{k}.txt"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
        want += text.splitlines()
    parts = text_parts(paths, n)
    assert len(parts) == n
    got = [line for part in parts for line in read_lines(part)]
    assert got == want
    for part in parts:  # ranges start at line starts
        for path, start, _ in part:
            assert start == 0 or path_bytes(path)[start - 1:start] == b"\n"


def path_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_parts_are_about_equal_and_bad_arguments_are_named(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("".join(f"line {i}\n" for i in range(10_000)))
    sizes = [sum(stop - start for _, start, stop in part) for part in text_parts(path, 4)]
    assert sum(sizes) == path.stat().st_size and max(sizes) - min(sizes) < 20
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        text_parts(path, 0)
    with pytest.raises(FileNotFoundError, match="no file at"):
        text_parts([path, tmp_path / "missing.txt"], 2)


class Words(Operator):
    def on_start(self, ctx, t):
        words = [w for line in read_lines(ctx.part) for w in line.split()]
        ctx.emit_batch(words, keys=words)


class Count(Operator):
    def on_batch(self, ctx, t, port, words):
        ctx.state.update(collections.Counter(words) + collections.Counter(ctx.state))

    def on_complete(self, ctx, t):
        ctx.output(dict(ctx.state))


def test_a_word_count_over_files_reads_each_part_on_its_shard(tmp_path):
    texts = ["the cat sat\non the mat\n", "the end\n\nof the cat", "mat mat\n"]
    paths = []
    for k, text in enumerate(texts):
        paths.append(tmp_path / f"{k}.txt")
        paths[-1].write_text(text)
    g = Graph("wc")
    src, count = g.node("src", Words, shards=3), g.node("count", Count, shards=2)
    g.edge(src, count, KEYED)
    with plaque.local_cluster(workers=2) as cluster:
        result = cluster.install(g).run(None, parts={"src": text_parts(paths, 3)}).result(30)
    counts: collections.Counter = collections.Counter()
    for shard_counts in result.values("count"):
        counts.update(shard_counts)
    assert counts == collections.Counter(" ".join(texts).split())


def lines_file(path, count: int) -> str:
    path.write_text("".join(f"line {i:05d}\n" for i in range(count)))
    return str(path)


def test_a_file_changed_after_planning_is_refused_naming_it_and_the_offset(tmp_path):
    path = lines_file(tmp_path / "in.txt", 20_000)
    parts = text_parts(path, 3)
    assert pickle.loads(pickle.dumps(parts)) == parts  # the stamp travels with a part
    assert pickle.loads(pickle.dumps(parts[1][0])).size == os.path.getsize(path)
    with open(path, "r+b") as f:  # truncated to a third, as a rewriting writer leaves it
        f.truncate(os.path.getsize(path) // 3)
    for part in parts:
        (_, start, _), = part
        with pytest.raises(plaque.SourceError, match=rf"{path} at byte {start}: changed since"
                                                     r" its parts were made \(size 220000 ->"
                                                     r" 73333 bytes"):
            list(read_lines(part))
    same_size = lines_file(tmp_path / "same.txt", 100)
    (part,) = text_parts(same_size, 1)
    st = os.stat(same_size)
    with open(same_size, "r+b") as f:  # same size, other bytes, a later mtime
        f.write(b"LINE")
    os.utime(same_size, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(plaque.SourceError, match=r"same.txt at byte 0: changed since"):
        list(read_lines(part))


def test_a_changed_file_fails_the_run_instead_of_reading_it_short(tmp_path):
    path = lines_file(tmp_path / "in.txt", 20_000)
    parts = text_parts(path, 3)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 3)
    g = Graph("short")
    src, count = g.node("src", Words, shards=3), g.node("count", Count, shards=1)
    g.edge(src, count, KEYED)
    with plaque.local_cluster(workers=1, transport="inproc") as cluster:
        with pytest.raises(plaque.OperatorError, match=r"SourceError.*in.txt at byte \d+:"
                                                       r" changed since its parts were made"):
            cluster.install(g).run(None, parts={"src": parts}).result(30)


def test_binary_input_is_a_short_source_error_naming_the_file_and_offset(tmp_path):
    path = tmp_path / "bin.txt"
    junk = bytes(range(128, 256)) * (2 * 1024 * 1024 // 128)  # 2 MiB, never UTF-8
    path.write_bytes(b"ok line\n" * 1000 + junk.replace(b"\x8a", b"\n"))
    (part,) = text_parts(path, 1)
    with pytest.raises(plaque.SourceError) as e:
        list(read_lines(part))
    assert str(e.value) == f"{path} at byte 8000: not UTF-8 text (invalid start byte)"
    assert isinstance(e.value.__cause__, UnicodeDecodeError) and e.value.path == str(path)
    assert isinstance(e.value, plaque.PlaqueError) and "SourceError" in plaque.__all__
    g = Graph("binary")
    src, count = g.node("src", Words, shards=1), g.node("count", Count, shards=1)
    g.edge(src, count, KEYED)
    with plaque.local_cluster(workers=1, transport="inproc") as cluster:
        with pytest.raises(plaque.OperatorError) as e:
            cluster.install(g).run(None, parts={"src": [part]}).result(30)
    first = str(e.value).split("\n")[0]  # the error's own line, not its remote traceback
    assert len(first) < 400 and f"{path} at byte 8000: not UTF-8 text" in first
    assert len(str(e.value)) < 10_000  # not the part's bytes (they were 3 MB of text)


def test_a_file_unreadable_at_reading_is_a_source_error(tmp_path):
    path = lines_file(tmp_path / "gone.txt", 10)
    (part,) = text_parts(path, 1)
    os.unlink(path)
    with pytest.raises(plaque.SourceError, match=r"gone.txt at byte 0: cannot read it:"
                                                 r" FileNotFoundError") as e:
        list(read_lines(part))
    assert isinstance(e.value.__cause__, FileNotFoundError)
    hand_made = [(str(tmp_path / "short.txt"), 0, 100)]  # no stamp: its length still counts
    lines_file(tmp_path / "short.txt", 2)
    with pytest.raises(plaque.SourceError, match=r"short.txt at byte 0: ends at byte 22,"
                                                 r" before its part's end 100"):
        list(read_lines(hand_made))


def test_an_empty_listing_is_refused_unless_allowed(tmp_path):
    """Issue 45 item 7: a glob that matched nothing ran and returned nothing."""
    with pytest.raises(ValueError, match=r"no input files: the listing is empty .*"
                                         r"allow_empty=True"):
        text_parts([], 2)
    assert text_parts([], 2, allow_empty=True) == [(), ()]
    assert [list(read_lines(p)) for p in text_parts([], 2, allow_empty=True)] == [[], []]
