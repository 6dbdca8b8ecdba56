"""A throwaway virtualenv with real TensorFlow and TFDS, made by the tests that need them (never our dependencies).

The venv lives in pytest's cache (``.pytest_cache/d/tf-venv``), so it is made once per checkout: about 1.8 GB and
a few minutes the first time, from PyPI or pip's own cache. Tests run scripts in it as subprocesses and compare
what TensorFlow and TFDS read with what tfrbeam wrote.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

TF_PACKAGES = ("tensorflow-cpu==2.21.0", "tensorflow-datasets==4.9.10")
SCRIPT_TIMEOUT_SECONDS = 600


def tf_venv_python(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The python of a venv holding ``TF_PACKAGES``, made on first use; skips, saying why, when pip cannot."""
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider: then once per session
    root = cache.mkdir("tf-venv") if cache is not None else tmp_path_factory.mktemp("tf-venv")
    venv = root / "venv"
    marker = venv / "installed.json"
    if marker.exists() and json.loads(marker.read_text()) == list(TF_PACKAGES):
        return venv / "bin" / "python"
    staging = root / f"venv.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True)
    installed = subprocess.run([str(staging / "bin" / "python"), "-m", "pip", "install", "--quiet", *TF_PACKAGES],
                               capture_output=True, text=True)
    if installed.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.skip(f"could not install {' '.join(TF_PACKAGES)} into a throwaway venv: {installed.stderr[-300:]}")
    (staging / "installed.json").write_text(json.dumps(list(TF_PACKAGES)))
    shutil.rmtree(venv, ignore_errors=True)
    try:
        staging.rename(venv)  # a venv's scripts name its directory: the python is called directly, so it still runs
    except OSError:  # another worker put one there first
        shutil.rmtree(staging, ignore_errors=True)
    return venv / "bin" / "python"


def run_in_tf_venv(python: pathlib.Path, script: str, *args: str) -> dict:
    """Run ``script`` in the TF venv with ``args``; it prints one JSON object last, which is returned."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    result = subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True, env=env,
                            timeout=SCRIPT_TIMEOUT_SECONDS)
    if result.returncode != 0:
        pytest.fail(f"the TensorFlow script failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
