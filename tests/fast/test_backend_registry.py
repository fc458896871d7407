"""The one registry of cap backends (``dispatch.capping.BACKENDS``): each entry is its class, under
its own name, with ``CapBackend.probe``'s one signature; the configuration check and a run (the
path a peer's agent takes, without that check) refuse the same unknown names."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from dispatch.capping import BACKENDS, ORDER, backend_class, select_backend
from dispatch.capping.base import CapBackend
from dispatch.config.model import validate_file
from dispatch.core.configfile import settings_from_dict
from dispatch.core.errors import BackendError, ConfigError


@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_entry_is_a_backend_of_that_name_with_the_one_probe_signature(name: str) -> None:
    cls = backend_class(name)
    assert issubclass(cls, CapBackend) and cls.name == name
    params = list(inspect.signature(cls.probe).parameters.values())
    assert [p.name for p in params[:2]] == ["configured_slice", "files"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[2:]), params


def test_none_is_registered_but_never_probed() -> None:
    assert "none" in BACKENDS and "none" not in ORDER and ORDER == tuple(BACKENDS)[:-1]


def test_an_unknown_backend_is_refused_on_the_agents_path(tmp_path: Path) -> None:
    """The plain parser (what a peer's agent reads its own file with) keeps the value; selecting the
    backend refuses it by name instead of falling through to another backend."""
    settings = settings_from_dict({"state_dir": str(tmp_path), "hosts": {"local": {"backend": "cgroupv2"}}},
                                  "peer.toml")
    with pytest.raises(BackendError) as caught:
        select_backend(settings.hosts["local"], 1 << 30)
    assert str(caught.value) == ("hosts.local.backend = 'cgroupv2' is not a cap backend "
                                 "(known: shared, systemd, cgroup2, cgroup1, none)")


def test_the_configuration_check_names_the_same_backends(tmp_path: Path) -> None:
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(f"state_dir = '{tmp_path}/state'\n[hosts.local]\nbackend = 'cgroupv2'\n")
    with pytest.raises(ConfigError) as caught:
        validate_file(str(cfg))
    assert f"must be one of {', '.join(BACKENDS)}" in str(caught.value)
