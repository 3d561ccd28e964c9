"""python_packages_dir: the dependency closure copied from this environment, cached and built atomically; mounted
read-only, the sandbox's python3.11 imports openai, and an OpenAI client inside calls a fake endpoint on the host's
loopback through the bridge, on every backend."""

from __future__ import annotations

import http.server
import importlib.metadata as md
import json
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import pytest

from relax_gym.sandbox.bridge import SocketBridge, bridge_mounts, bridged_command
from relax_gym.sandbox.pyruntime import (
    LIBS_DIR,
    MANIFEST,
    distribution_closure,
    python_packages_dir,
    python_tag,
    runtime_env,
    runtime_mount,
)

from .conftest import run
from .test_bridge import reply
from .test_mounts import with_mounts

pytestmark = pytest.mark.timeout(180)


def _names(dists) -> set[str]:
    return {d.metadata["Name"].lower().replace("_", "-") for d in dists}


@pytest.fixture(scope="module")
def cache_dir():
    """A cache the sandbox uid can reach (the suite's cache may live under a 0700 home), removed afterwards."""
    path = tempfile.mkdtemp(prefix="relax-gym-test-pyruntime-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def openai_site(cache_dir):
    return python_packages_dir(["openai"], cache_dir=cache_dir)


# ---------------------------------------------------------------------------------------------- host side


def test_closure_follows_requirements_and_drops_false_markers_and_extras():
    pydantic = _names(distribution_closure(["pydantic"]))
    assert {"pydantic", "pydantic-core", "annotated-types", "typing-extensions"} <= pydantic
    assert "email-validator" not in pydantic  # only under the "email" extra
    openai = _names(distribution_closure(["openai"]))
    assert pydantic <= openai and "openai" in openai
    # installed here (ray needs them), but only an extra of openai / a dependency under python_version < "3.11"
    assert not {"aiohttp", "exceptiongroup"} & openai
    assert {"aiohttp", "multidict", "yarl"} <= _names(distribution_closure(["openai[aiohttp]"]))


def test_unknown_or_invalid_distributions_are_refused_by_name():
    with pytest.raises(ValueError, match="'no-such-dist-relax-gym' is neither a distribution nor a module installed"
                                         ".*name the distribution the program imports from"):
        python_packages_dir(["no-such-dist-relax-gym"])
    with pytest.raises(ValueError, match="invalid requirement"):
        distribution_closure(["not a name!"])
    with pytest.raises(ValueError, match="no distributions"):
        distribution_closure([])


def test_an_import_name_finds_the_distribution_that_provides_it():
    """What a program imports (``yaml``, ``PIL``) is accepted for the distribution (PyYAML, pillow)."""
    assert _names(distribution_closure(["yaml"])) == _names(distribution_closure(["pyyaml"])) == {"pyyaml"}
    assert "pillow" in _names(distribution_closure(["PIL"]))


def test_packages_come_from_another_venv_when_its_python_is_named(cache_dir):
    """An agent SDK whose pins are not ours lives in a venv of its own; its packages are copied from there."""
    from tests.envs.agent_clients import sdk_venv

    python = sdk_venv() / "bin" / "python"  # Anthropic's client among the agent SDKs of tests/envs/agent_clients.py
    with pytest.raises(ValueError, match="'anthropic' is neither a distribution nor a module installed in"):
        python_packages_dir(["anthropic"], cache_dir)  # not in ours
    site = python_packages_dir(["anthropic"], cache_dir, python=python)
    recorded = json.loads((site / "relax-gym-runtime.json").read_text())
    assert (site / "anthropic" / "__init__.py").is_file() and "anthropic==2.17.0" in recorded["distributions"]
    with pytest.raises(ValueError, match=f"copying nosuch from {python}: 'nosuch' is neither"):
        python_packages_dir(["nosuch"], cache_dir, python=python)


def test_directory_holds_the_closure_is_cached_and_recorded(openai_site, cache_dir):
    manifest = json.loads((openai_site / MANIFEST).read_text())
    assert manifest["python"] == python_tag() and manifest["requested"] == ["openai"]
    assert f"openai=={md.version('openai')}" in manifest["distributions"]
    for top in ("openai", "pydantic", "pydantic_core"):
        assert (openai_site / top / "__init__.py").is_file()
    assert any((openai_site / "openai").glob("__pycache__/*.pyc"))
    assert not any(p.name.startswith(".openai-") for p in openai_site.parent.iterdir())  # no temp dir left
    before = (openai_site / MANIFEST).stat().st_mtime_ns
    assert python_packages_dir(["openai"], cache_dir=cache_dir) == openai_site
    assert (openai_site / MANIFEST).stat().st_mtime_ns == before
    for dirpath, dirs, files in os.walk(openai_site):  # readable by the sandbox uid
        assert all(os.stat(os.path.join(dirpath, d)).st_mode & 0o005 == 0o005 for d in dirs)
        assert all(os.stat(os.path.join(dirpath, f)).st_mode & 0o004 for f in files)
    env = runtime_env(openai_site)
    assert env["PYTHONPATH"] == "/opt/relax/site"
    assert ("LD_LIBRARY_PATH" in env) == bool(manifest["native_libs"])
    assert sorted(os.listdir(openai_site / LIBS_DIR)) == manifest["native_libs"]


def test_concurrent_builders_agree_and_leave_no_temp_dirs(cache_dir):
    root = os.path.join(cache_dir, "concurrent")
    with ThreadPoolExecutor(4) as pool:
        paths = set(pool.map(lambda _: python_packages_dir(["idna", "sniffio"], cache_dir=root), range(4)))
    assert len(paths) == 1
    assert os.listdir(root) == [paths.pop().name]


# ---------------------------------------------------------------------------------------------- in a sandbox


def test_sandbox_python_imports_openai(backend, spec, openai_site):
    box_spec = with_mounts(spec, runtime_mount(openai_site), **runtime_env(openai_site))

    async def body():
        box = await backend.create(box_spec)
        try:
            return await box.exec(["python3", "-c", "import sys, openai; print(sys.version_info[:2], openai.__version__)"])
        finally:
            await box.close()

    r = run(body())
    assert r.ok and r.stdout == f"(3, 11) {md.version('openai')}\n", r


class _FakeChat(http.server.BaseHTTPRequestHandler):
    requests: ClassVar[list] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, self.headers.get("Authorization"), body))
        answer = json.dumps({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "pong: " + body["messages"][-1]["content"]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }).encode()
        reply(self, answer, "application/json")

    def log_message(self, *args):
        pass


_AGENT = (
    "import openai\n"
    "client = openai.OpenAI(base_url='http://127.0.0.1:8765/v1', api_key='k', max_retries=0, timeout=60)\n"
    "r = client.chat.completions.create(model='fake', messages=[{'role': 'user', 'content': 'ping'}])\n"
    "print(r.choices[0].message.content, r.usage.total_tokens)\n"
)


def test_openai_client_in_the_sandbox_reaches_a_host_loopback_endpoint(backend, spec, openai_site):
    handler = type("Handler", (_FakeChat,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def body(bridge):
        # the recipe: bridge dir + forwarder + runtime mounted read-only; the runtime's env given to the command only
        box = await backend.create(with_mounts(spec, *bridge_mounts(bridge), runtime_mount(openai_site)))
        try:
            return await box.exec(bridged_command(["python3", "-c", _AGENT], env=runtime_env(openai_site)))
        finally:
            await box.close()

    try:
        with SocketBridge("127.0.0.1", server.server_address[1]) as bridge:
            r = run(body(bridge))
    finally:
        server.shutdown()
        server.server_close()
    assert r.ok and r.stdout == "pong: ping 3\n", r
    [(path, auth, request)] = handler.requests
    assert (path, auth, request["model"]) == ("/v1/chat/completions", "Bearer k", "fake")
