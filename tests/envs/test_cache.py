from pathlib import Path

from relax_gym.envs.cache import cache_home
from relax_gym.envs.interop.venvs import cache_root
from relax_gym.envs.remote.launcher import log_dir
from relax_gym.envs.samples import sample_root


def test_the_cache_is_the_named_folder_with_tilde_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RELAX_GYM_CACHE", "~/elsewhere")
    assert cache_home() == tmp_path / "elsewhere"
    monkeypatch.delenv("RELAX_GYM_CACHE")
    assert cache_home() == tmp_path / ".cache" / "relax-gym"


def test_every_cached_thing_lives_under_the_one_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAX_GYM_CACHE", str(tmp_path))
    for folder in (cache_root(), log_dir(), sample_root()):
        assert Path(folder).is_relative_to(tmp_path), folder
