"""TorchInductor technology of the runtime: compiling a partition, and what superkernel changes around it.

* :mod:`.compile` — one partition compiled by Inductor (both devices);
* :mod:`.cpu_freezing` — CPU max-autotune: plain or frozen weights, the faster kept at the real shapes;
* :mod:`.tweaks` — every Inductor internal superkernel patches, as one list (checked against the installed
  torch) — and the modules that implement them: :mod:`.frozen_code`, :mod:`.gemm_timing`, :mod:`.bf16_gemv`,
  :mod:`.autotune_builds`, :mod:`.background_build`;
* :mod:`.shared_kernels` (identical layers share one compile), :mod:`.quant_gemv` (the int8 GEMV rewrite),
  :mod:`.output` (Inductor's prints to a debug log);
* :mod:`.autofusion` — the autofusion planner, which runs inside CPU max-autotune compiles.
"""
