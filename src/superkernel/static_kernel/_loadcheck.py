"""Fresh-process load check of static kernel artifacts (run by the builder at finalize).

``python -m superkernel.static_kernel._loadcheck ARTIFACT.bin ...`` with
``TORCHINDUCTOR_CACHE_DIR`` pointing at the build's staging cache: loads every artifact
with ``torch._inductor.CompiledArtifact.load`` exactly as a later process will, prints one
JSON line and exits non-zero if any fails. It runs nothing but torch's own loader.
"""

from __future__ import annotations

import json
import sys

from superkernel.util import exception_summary


def main(argv: list[str]) -> int:
    from superkernel.static_kernel import compat

    failed = []
    for path in argv:
        try:
            compat.load_artifact(path)
        except Exception as exc:  # noqa: BLE001 - reported to the builder
            failed.append({"path": path, "error": exception_summary(exc, 500, first_line=False)})
    print(json.dumps({"loaded": len(argv) - len(failed), "failed": failed}))
    if failed:
        print(f"load check failed for {len(failed)} artifact(s): {failed[0]['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
