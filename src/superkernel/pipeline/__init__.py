"""The compile pipeline, one module per stage in data-flow order.

``ir`` (records every stage shares) -> ``capture`` (Dynamo graph -> inference ATen graph)
-> ``passes`` -> ``segments`` (scopes -> segments and cuts) -> ``partition`` (standalone
partition graphs, the assembled step) -> ``realize`` (one callable per partition, through
``superkernel.runtime`` and the static-kernel compiler seam) -> ``backend`` (the
torch.compile entry, ``explain``).
"""
