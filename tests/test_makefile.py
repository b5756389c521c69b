"""The Makefile's targets do what the README says they do and no more (dry runs: `make -n`);
llama.cpp is built without what text generation does not use, on every core, its progress one
short line a file, in the background of `make run`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def planned(target: str, tmp_path: Path) -> str:
    """The commands `make TARGET` would run from scratch (every file out of date), in a venv
    that does not exist yet."""
    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    # Run as `make test` runs the tests (a sub-make: MAKELEVEL and MAKEFLAGS set), a plan
    # still prints no "Entering directory" lines, and is the same from a shell.
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def test_each_client_needs_only_its_own_generator(tmp_path: Path) -> None:
    python = planned("client-python", tmp_path)
    assert '"openapi-python-client>=' in python and "clients/python/generate.py" in python
    # Not the service's packages (a llama.cpp build), the dev toolchain, nor Node.js.
    assert "pip install" in python and "-e " not in python and ".[" not in python
    assert "npm" not in python

    typescript = planned("client-typescript", tmp_path)
    assert "npm ci" in typescript and "npx tsc" in typescript
    assert "pip" not in typescript and "venv" not in typescript

    both = planned("clients", tmp_path)
    assert both == python + typescript


def make(rule: str, *targets: str, **env: str) -> str:
    """Run make in the checkout, with an extra rule if given."""
    extra = ["--eval", rule] if rule else []
    done = subprocess.run(
        ["make", "--no-print-directory", "-s", *extra, *targets],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_llama_cpp_is_built_without_the_multimodal_library_on_every_core() -> None:
    """A cold `make run` compiled llama.cpp's vision and audio encoders too (618 s to healthy)."""
    shown = make('cmake-env: ; @echo "$$CMAKE_ARGS|$$CMAKE_BUILD_PARALLEL_LEVEL"', "cmake-env")
    args, parallel = shown.strip().split("|")
    for option in ("LLAVA_BUILD", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_TOOLS", "LLAMA_BUILD_EXAMPLES"):
        assert f"-D{option}=OFF" in args.split()
    assert int(parallel) == os.cpu_count()
    # Options of one's own come last, so they win.
    mine = make('cmake-env: ; @echo "$$CMAKE_ARGS"', "cmake-env", CMAKE_ARGS="-DGGML_CUDA=on")
    assert mine.split()[-1] == "-DGGML_CUDA=on" and "-DLLAVA_BUILD=OFF" in mine.split()


def test_the_build_shows_one_short_line_a_file(tmp_path: Path) -> None:
    log = tmp_path / "pip.log"
    log.write_text(
        "  [64/140] /usr/bin/g++ -DGGML_SHARED -O3 -o vendor/llama.cpp/src/llama-mmap.cpp.o "
        "-c /tmp/pip-install-x/llama-cpp-python/vendor/llama.cpp/src/llama-mmap.cpp\n"
        "  [83/140] : && /usr/bin/g++ -fPIC -O3 -shared -o bin/libllama.so a.o b.o && :\n"
        "  -- Configuring done\n"
        "Successfully installed llama-cpp-python-0.3.36\n"
    )
    shown = make(f"show: ; @$(SHOW_PROGRESS) {log}", "show")
    assert shown.splitlines() == [
        "  building llama.cpp [64/140] llama-mmap.cpp",
        "  building llama.cpp [83/140] libllama.so",
        "Successfully installed llama-cpp-python-0.3.36",
    ]


def test_make_run_serves_while_the_local_model_builds() -> None:
    """`make run` waits for the service's packages only; the local extra is another target,
    started in the background (a cold llama.cpp build kept the API down for minutes)."""
    plan = make("", "-n", "run", "VENV=/nonexistent-venv")  # what it would do, not done
    assert " -e . " in plan and "'.[local]'" not in plan  # the local extra is not waited for
    background = plan.index("setsid nohup $SUBMAKE")
    assert "/nonexistent-venv/.installed-local-" in plan[background:]
    assert "> /nonexistent-venv/local-build.log" in plan[background:]
    assert background < plan.index("/nonexistent-venv/bin/threadline serve")
    stamp = plan[background:].split("--no-print-directory ", 1)[1].split()[0]
    local = make("", "-n", stamp, "VENV=/nonexistent-venv")  # what the background make does
    assert "-e '.[local]'" in local
