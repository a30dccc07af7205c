"""Checkpoint write and read speed: a sharded array saved and loaded by the hosts, against
the same bytes written and read by plain numpy (and by zarr-python) from one process.

Our path: a cluster of 2 host processes with 1 emulated device each; a float32 array of
``--mib`` MiB made on the hosts (``client.generate``, half on each), then ``client.save``
(each host writes its half as one Zarr chunk and fsyncs it; the client writes metadata and
commits with a rename) and ``client.load`` onto the same mesh (each host reads its chunk).
Baselines, in this process: ``np.save`` + fsync and ``np.load`` of the whole array; zarr-python
writing and reading the same two chunks (uncompressed). Every figure is GB/s of array bytes
(10^9 B/s), best of ``--reps``; reads come from the page cache on both sides (the files were
just written), so they measure the software path, not the disk.

Run: ``python -m bench.checkpoint [--quick] [--no-append]``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import numpy as np

import pathways as pw
from pathways import P

from .results import bench_parser, publish, security_for_all

TITLE = "Checkpoints: 2 hosts writing and reading their shards vs one process"


def _fill(idx):
    """A host's part of the array: cheap to make, not all zeros."""
    rows = idx[0].stop - idx[0].start
    return np.broadcast_to(np.arange(rows, dtype=np.float32)[:, None] + idx[0].start,
                           (rows, idx[1].stop - idx[1].start)).copy()


def _best(fn, reps) -> float:
    best = float("inf")
    for _ in range(reps):
        best = min(best, fn())
    return best


def measure_ours(client, mesh, shape, root, reps) -> tuple[float, float]:
    x = client.generate(_fill, shape, np.float32, mesh, P("d"))
    x.block_until_ready(timeout=300)
    path = os.path.join(root, "ours")

    def write():
        shutil.rmtree(path, ignore_errors=True)
        t0 = time.perf_counter()
        client.save(path, x).result(timeout=600)
        return time.perf_counter() - t0

    def read():
        t0 = time.perf_counter()
        y = client.load(path, mesh).block_until_ready(timeout=600)
        seconds = time.perf_counter() - t0
        y.delete()
        return seconds

    w, r = _best(write, reps), _best(read, reps)
    y = client.load(path, mesh)
    head = y.result(timeout=600)[:: shape[0] // 4, :2]  # spot check (the client fetches it)
    assert np.array_equal(head, _fill((slice(0, shape[0]), slice(0, 2)))[:: shape[0] // 4])
    y.delete()
    x.delete()
    return w, r


def measure_numpy(value, root, reps) -> tuple[float, float]:
    path = os.path.join(root, "plain.npy")

    def write():
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            np.save(f, value)
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - t0

    def read():
        t0 = time.perf_counter()
        np.load(path)
        return time.perf_counter() - t0

    return _best(write, reps), _best(read, reps)


def measure_zarr(value, root, reps) -> tuple[float, float]:
    import zarr

    path = os.path.join(root, "zarr-python")

    def write():
        shutil.rmtree(path, ignore_errors=True)
        t0 = time.perf_counter()
        z = zarr.create_array(store=path, shape=value.shape, dtype=value.dtype,
                              chunks=(value.shape[0] // 2, value.shape[1]), compressors=None)
        z[...] = value
        return time.perf_counter() - t0

    def read():
        t0 = time.perf_counter()
        zarr.open_array(store=path, mode="r")[...]
        return time.perf_counter() - t0

    return _best(write, reps), _best(read, reps)


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "64 MiB, one round")
    ap.sized("--mib", int, 64, 1024, "array size in MiB")
    ap.sized("--reps", int, 1, 3, "rounds per figure (best kept)")
    args = ap.parse_args(argv)
    rows_, cols = 2 * 1024, args.mib * 1024 * 1024 // (4 * 2 * 1024)
    shape, nbytes = (rows_, cols), rows_ * cols * 4
    root = tempfile.mkdtemp(prefix="bench-checkpoint-", dir=os.environ.get("BENCH_DIR"))
    try:
        with security_for_all(args.insecure, args.curve) as security, \
                pw.local_cluster(islands=1, hosts_per_island=2, devices_per_host=1,
                                 hbm_gib=max(2.0, 2 * args.mib / 1024), **security) as cluster, \
                pw.connect(cluster.address) as client:
            mesh = client.mesh((2,), ("d",))
            ours = measure_ours(client, mesh, shape, root, args.reps)
        value = _fill((slice(0, rows_), slice(0, cols)))
        plain = measure_numpy(value, root, args.reps)
        zarr_python = measure_zarr(value, root, args.reps)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def gbs(seconds):
        return f"{nbytes / seconds / 1e9:.2f}"

    rows = [
        {"Path": "pathways: 2 hosts, save / load", "Write GB/s": gbs(ours[0]),
         "Read GB/s": gbs(ours[1])},
        {"Path": "numpy, one process (np.save + fsync / np.load)", "Write GB/s": gbs(plain[0]),
         "Read GB/s": gbs(plain[1])},
        {"Path": "zarr-python, one process, same chunks", "Write GB/s": gbs(zarr_python[0]),
         "Read GB/s": gbs(zarr_python[1])},
    ]
    notes = "\n".join([
        f"A float32 array of {nbytes / 2**20:.0f} MiB, shape {shape}, split in 2 row blocks"
        f" (one per host); best of {args.reps}. Directory: {os.path.dirname(root)}.",
        f"pathways / numpy: write {plain[0] / ours[0]:.2f}x, read {plain[1] / ours[1]:.2f}x.",
        "Writes include fsync on our path and numpy's (zarr-python does not fsync); reads come"
        " from the page cache. Ours includes the client's metadata (zarr) and the round trips"
        " to the hosts; its load includes moving the shards into the devices' HBM accounting.",
    ])
    publish(TITLE, rows, notes, append=not (args.quick or args.no_append))
    return 0


if __name__ == "__main__":
    sys.exit(main())
