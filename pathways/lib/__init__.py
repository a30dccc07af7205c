"""Libraries built on the public API, run by the client: Mixture-of-Experts layers (``moe``,
sparse routing with ``expert_map``, §6.3 of the paper) and MPMD pipelines (``pipeline``,
GPipe-style stages on separate meshes, §5.3)."""

from .moe import MoELayer
from .pipeline import Pipeline, Stage

__all__ = ["MoELayer", "Pipeline", "Stage"]
