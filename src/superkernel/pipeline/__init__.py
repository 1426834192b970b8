"""The compile pipeline, one module per stage in data-flow order.

``ir`` (records every stage shares) -> ``tracing`` (the Dynamo settings a compile traces under; graph
breaks inside scopes; ``backend_context``: how Dynamo enters a backend's context, torch unchanged) -> ``capture`` (Dynamo graph -> inference ATen graph; ``capture_fallback``: a frame
traced again without capturing data-dependent values) -> ``passes`` -> ``segments`` (scopes -> segments
and cuts) -> ``partition`` (standalone partition graphs, the assembled step) -> ``realize`` (one callable
per partition, through ``superkernel.runtime`` and the static-kernel compiler seam) -> ``backend`` (the
torch.compile entry, ``explain``); ``graph_dump`` writes the graphs of ``debug.graph_dump``.
"""
