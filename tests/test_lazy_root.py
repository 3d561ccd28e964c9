"""Importing the package root, ``relax_gym.omni`` or ``relax_gym.trainer.algorithms`` loads no environment, no
sandbox module and reads no manifest; the first ``list_envs`` / ``spec`` / ``make`` discovers them.

Each case runs in a fresh interpreter (this one has long since imported everything). An audit hook records every
file the child opens, so a manifest read is seen however the manifest loader reads it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Run in the child: import the modules, then report what is loaded and which env.toml files were opened, before
# and after the first registry call.
CHILD = """
import json, sys
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" and args and str(args[0]).endswith("env.toml") else None)
for name in {modules!r}:
    __import__(name)
loaded = sorted(m for m in sys.modules if m.startswith(("relax_gym.envs", "relax_gym.sandbox")))
before = list(opened)
import relax_gym
{first_use}
print(json.dumps({{"loaded": loaded, "manifests_before": before, "manifests_after": opened,
                  "loaded_after": sorted(m for m in sys.modules if m.startswith("relax_gym.envs"))}}))
"""


def _child(modules: list[str], first_use: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(modules=modules, first_use=first_use)],
                         capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("modules", [["relax_gym"], ["relax_gym.omni", "relax_gym.omni.parts"],
                                     ["relax_gym.trainer.algorithms"]])
def test_importing_loads_no_env_no_sandbox_and_reads_no_manifest(modules):
    seen = _child(modules, "relax_gym.list_envs()")
    assert seen["loaded"] == [], f"importing {modules} loaded {seen['loaded']}"
    assert seen["manifests_before"] == [], f"importing {modules} read {seen['manifests_before']}"
    # the probe itself works: the first registry call reads the built-in manifests and loads the registry
    assert any(p.endswith("nextqa-video/env.toml") for p in seen["manifests_after"])
    assert "relax_gym.envs.registry" in seen["loaded_after"]


@pytest.mark.parametrize("first_use", ["relax_gym.spec('nextqa-video')", "from relax_gym import make; make.__name__",
                                       "import gymnasium; relax_gym.discover(); gymnasium.spec('relax/nextqa-video-v1')"])
def test_public_names_still_reach_the_registry(first_use):
    seen = _child(["relax_gym"], first_use)
    assert "relax_gym.envs.registry" in seen["loaded_after"]


def test_root_lists_its_public_names():
    import relax_gym

    assert {"make", "register", "spec", "list_envs", "discover", "__version__"} <= set(relax_gym.__all__)
    assert set(relax_gym.__all__) <= set(dir(relax_gym))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        relax_gym.nope  # noqa: B018
