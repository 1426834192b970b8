"""superkernel[tools]: the ``superkernel`` command (optimize / analyze / bench /
static-compile), the model zoo and checkpoint loader, the decode harness and the
advisor that measures plans and writes reports. Needs transformers, rich, matplotlib
and PyYAML (``pip install superkernel[tools]``)."""
