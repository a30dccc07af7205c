"""Plaque from plain Python: a sparse, data-dependent exchange across worker processes.

Each run, a sharded source makes a batch of "tokens" with a score; a router sends each token
only to the shard its score picks (a data-dependent subset of the 8 aggregator shards, some of
which get nothing); each aggregator acts once progress tracking says its input for the run is
complete, which also happens for the shards that received nothing at all.

    python examples/plaque_sparse_exchange.py [--workers 3] [--runs 3] [--transport tcp|ipc]
"""

import argparse

import numpy as np

import plaque
from plaque import KEYED, ONE_TO_ONE, Graph, Operator

AGGREGATORS = 8


class Tokens(Operator):
    """Source: ``arg`` tokens per shard, each a (token id, score) pair; the scores are skewed."""

    def on_complete(self, ctx, t):
        rng = np.random.default_rng([t, ctx.shard])
        scores = rng.beta(0.6, 3.0, size=ctx.arg)  # most scores small: a skewed routing
        for i, score in enumerate(scores):
            ctx.emit((f"s{ctx.shard}t{i}", float(score)))


class Router(Operator):
    """Sends a token to the aggregator its score selects; scores above 0.9 are dropped."""

    def on_input(self, ctx, t, port, token):
        _, score = token
        if score < 0.9:
            ctx.emit(token, shard=int(score * AGGREGATORS / 0.9))


class Aggregate(Operator):
    """Counts and sums what arrived, once the run's input is complete, and reports it."""

    def __init__(self):
        self.tokens = {}

    def on_input(self, ctx, t, port, token):
        self.tokens.setdefault(t, []).append(token)

    def on_complete(self, ctx, t):
        got = self.tokens.pop(t, [])
        ctx.output({"worker": ctx.worker, "count": len(got),
                    "score_sum": round(sum(s for _, s in got), 3)})


def build_graph(sources: int) -> Graph:
    g = Graph("sparse-exchange")
    src = g.node("tokens", Tokens, shards=sources)
    router = g.node("router", Router, shards=sources)
    agg = g.node("aggregate", Aggregate, shards=AGGREGATORS)
    g.edge(src, router, ONE_TO_ONE)
    g.edge(router, agg, KEYED)
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=50, help="tokens per source shard per run")
    ap.add_argument("--transport", default="tcp", choices=["tcp", "ipc", "inproc"])
    args = ap.parse_args()

    graph = build_graph(sources=args.workers)
    print(f"graph {graph.name!r}: {len(graph.nodes)} nodes, {len(graph.edges)} edges "
          f"({sum(n.shards for n in graph.nodes)} shards) on {args.workers} worker processes")
    with plaque.local_cluster(workers=args.workers, transport=args.transport) as cluster:
        print(f"coordinator at {cluster.address.split('|')[0]}; workers {cluster.workers()}")
        installed = cluster.install(graph)
        futures = [installed.run(args.tokens) for _ in range(args.runs)]  # runs overlap
        for fut in futures:
            result = fut.result(timeout=60)
            print(f"\nrun t={result.timestamp}:")
            for shard, [report] in sorted(result.outputs["aggregate"].items()):
                note = "  (nothing routed here; completed by progress tracking)" \
                    if report["count"] == 0 else ""
                print(f"  aggregate[{shard}] on worker {report['worker']}: "
                      f"{report['count']:3d} tokens, score sum {report['score_sum']:7.3f}{note}")
        wire = plaque.total({p: c for w, peers in cluster.counters().items() if w >= 0
                             for p, c in peers.items()})
        print(f"\nwire (all workers): {wire['messages_sent']} messages, "
              f"{wire['tuples_sent']} tuples, {wire['bytes_sent']} bytes sent; "
              f"{wire['progress_sent']} of the messages were progress updates")


if __name__ == "__main__":
    main()
