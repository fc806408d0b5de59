"""A missing zoo checkpoint names the command that makes it."""

from __future__ import annotations

import pytest

from dsparklab.errors import ProvenanceError
from dsparklab.zoo import load


@pytest.mark.parametrize(
    ("name", "command"),
    [("smol-target", "dsparklab zoo prepare --tier smol"), ("tiny-dspark", "dsparklab zoo train")],
)
def test_missing_checkpoint_names_its_command(tmp_path, monkeypatch, name, command):
    monkeypatch.setattr(load, "ZOO_DIR", tmp_path)
    with pytest.raises(ProvenanceError, match=f"{tmp_path / name}.*`{command}"):
        load.zoo_path(name)
