"""CPU technology of the runtime: a partition as a flat ATen program (:mod:`.flat`), and that program as one
native C++ call (:mod:`.native`), the CPU reduce-overhead realization."""
