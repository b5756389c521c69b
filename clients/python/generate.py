"""Generate the Python client from openapi/openapi.json: `make client-python` runs this.

    python clients/python/generate.py [OUTPUT]   # default: clients/python/threadline_client

openapi-python-client writes the package (models, one module per operation); the streaming
helper (streaming.py, next to this file) is copied into it as `threadline_client.streaming`.
Fails on any generator warning: a warning means a schema or an operation was left out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DOCUMENT = ROOT / "openapi" / "openapi.json"
DEFAULT_OUTPUT = HERE / "threadline_client"


def generate(output: Path) -> str:
    """Write the package to `output` (replacing it); returns the generator's output."""
    bin_dir = Path(sys.executable).parent  # the generator, and the ruff its post-hooks run
    shutil.rmtree(output, ignore_errors=True)
    result = subprocess.run(
        [
            str(bin_dir / "openapi-python-client"),
            "generate",
            "--path",
            str(DOCUMENT),
            "--output-path",
            str(output),
            "--meta",
            "none",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
        check=False,
    )
    log = result.stdout + result.stderr
    if result.returncode != 0 or "warning" in log.lower():
        raise SystemExit(f"openapi-python-client failed or warned:\n{log}")
    shutil.copy(HERE / "streaming.py", output / "streaming.py")
    return log


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT
    print(generate(target).strip())
    print(f"generated {target}")
