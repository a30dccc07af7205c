"""``plaque.readers``: text files cut into line-aligned parts, every line in exactly one part,
in order; and a word count over files on disk whose source shards each read their own part."""

from __future__ import annotations

import collections

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
