"""Serving engines: thin adaptors onto superkernel's backend and plans (``vllm/``). Nothing here is imported by
``import superkernel``; each engine's package is needed only by its adaptor."""
