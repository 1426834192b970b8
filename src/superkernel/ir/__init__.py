"""The records every stage shares (layer 0): what a scope is, how a graph was partitioned, what explain() shows.

* :mod:`.graph` — scope options, partitions and segmentation, cuts, the explain records of segments, CUDA
  graphs and graphs;
* :mod:`.decision` — the autofusion planner's decisions as explain() records them.
"""
