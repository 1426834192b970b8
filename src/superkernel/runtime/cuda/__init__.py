"""CUDA technology of the runtime: CUDA graphs (capture, replay, the step's graphs) and streams.

* :mod:`.driver` — the few ``torch.cuda`` calls capture and replay make, behind one object (tests
  replace it with a recording fake that checks our bookkeeping, never a GPU result);
* :mod:`.graph_runner` — one callable captured once per input signature and replayed, with private
  static input buffers, in-place inputs, bounded recapture and a failed capture that falls back alone;
* :mod:`.step_graph` — a compiled graph's partitions grouped between cuts, each group one CUDA graph;
* :mod:`.streams` — ``stream-fusion=1``: independent branches of a segment on parallel streams.
"""
