"""OpenEnv envs shipped as Docker images: ``relax_gym.make("openenv:IMAGE", sandbox={...})`` runs the image's own
server in a docker sandbox of ours, under its limits, and plays it with OpenEnv's client through a Unix socket.

The image is made as OpenEnv makes one (``openenv init``'s layout and Dockerfile, built by the engine:
tests/envs/interop/openenv_image_build.py). Shown: the env passes check_env; the container has our limits (no
network but ``lo`` — seen from inside the env —, memory, cpus, pids, read-only root, no capabilities, non-root);
a server killed by its memory limit masks the episode with an error naming OpenEnv and the call; an image whose
server cannot start, or that has no command, is one error naming the image."""

from __future__ import annotations

import docker
import pytest

import relax_gym
from relax_gym.envs import check_env
from relax_gym.envs.interop import openenv_image
from relax_gym.envs.interop.frameworks import FRAMEWORKS
from relax_gym.envs.interop.openenv_image import ImageServerError, image_server, parse_limits, server_port
from relax_gym.envs.interop.venvs import ensure_venv
from relax_gym.sandbox.spec import DEFAULT_IMAGE

from .openenv_image_build import build_openenv_image

LIMITS = {"memory_mb": 768, "cpus": 0.5, "pids": 128}


@pytest.fixture(scope="module")
def image():
    """The example env's image (built once per machine), and no image server left running after the module."""
    yield build_openenv_image(ensure_venv(FRAMEWORKS["openenv"]))
    openenv_image.close_image_servers()


def test_an_openenv_image_passes_check_env_inside_a_sandbox_with_our_limits(image, servers):
    env = relax_gym.make(f"openenv:{image}", observation_field="prompt", gold="{secret}", sandbox=LIMITS)
    report = check_env(env)
    assert "gold action => max reward" in report.passed and "garbage action => min reward, no exception" in report.passed
    obs, info = env.reset(seed=5)
    assert obs[0].text == f"Say the word {info['gold']} back, and nothing else."
    assert env.step(info["gold"])[1] == 1.0
    env.reset(seed=5)
    assert env.step("show the interfaces")[4]["openenv_observation"]["prompt"] == "lo"  # as the env sees it
    env.close()
    container = docker.from_env().containers.get(image_server(image, LIMITS).sandbox_id)
    host = container.attrs["HostConfig"]
    assert container.image.tags == [image] and container.attrs["Config"]["User"] == "1000:1000"
    assert (host["NetworkMode"], host["Memory"], host["MemorySwap"], host["NanoCpus"], host["PidsLimit"]) == \
        ("none", 768 << 20, 768 << 20, 500_000_000, 128)
    assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]


def test_a_server_killed_by_its_memory_limit_masks_the_episode(image, servers):
    env = relax_gym.make(f"openenv:{image}", observation_field="prompt", sandbox={"memory_mb": 384})
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("eat 512")
    assert (info["status"], terminated, reward) == ("env_error", True, 0.0)
    assert f"OpenEnv {image} at http://127.0.0.1:" in info["error"] and ": step raised " in info["error"], info["error"]
    env.close()


def test_an_image_whose_server_cannot_start_is_one_error_naming_the_image(image):
    client = docker.from_env()
    broken = f"{image}-broken"
    # the same image with the command replaced by one that fails the way a missing model file does
    client.images.build(fileobj=__import__("io").BytesIO(
        f'FROM {image}\nCMD ["sh", "-c", "echo cannot find the model weights >&2; exit 3"]\n'.encode()), tag=broken, rm=True)
    try:
        with pytest.raises(ImageServerError, match=rf"OpenEnv image {broken}: its server ended before it was ready: "
                                                   r"exit status 3: cannot find the model weights"):
            image_server(broken)
        with pytest.raises(ImageServerError, match=rf"OpenEnv image {DEFAULT_IMAGE} has no CMD or ENTRYPOINT"):
            image_server(DEFAULT_IMAGE)
        with pytest.raises(Exception, match="image 'no-such/openenv-env:1' not found in the local Docker engine"):
            image_server("no-such/openenv-env:1")
    finally:
        client.images.remove(broken)
    assert not client.containers.list(all=True, filters={"ancestor": broken})


def test_limits_are_checked_and_only_limits_may_be_set():
    with pytest.raises(ImageServerError, match=r"OpenEnv image img: sandbox.network: Extra inputs are not permitted"):
        parse_limits("img", {"network": True})
    with pytest.raises(ImageServerError, match=r"sandbox.memory_mb: Input should be greater than or equal to 64"):
        parse_limits("img", {"memory_mb": 1})
    assert server_port("img", {"ExposedPorts": {"7860/tcp": {}}}, None) == 7860
    assert server_port("img", {}, None) == 8000 and server_port("img", {"ExposedPorts": {"1/tcp": {}}}, 9) == 9
    with pytest.raises(ImageServerError, match=r"exposes ports \[1, 2\]: say which one"):
        server_port("img", {"ExposedPorts": {"1/tcp": {}, "2/tcp": {}}}, None)
    with pytest.raises(ValueError, match="sandbox= sets the limits of an image's sandbox; a URL has none"):
        relax_gym.make("openenv:http://127.0.0.1:9", sandbox={"cpus": 1})


def test_a_failed_start_reports_the_servers_words_not_the_readiness_polls():
    """The forwarder's "cannot connect" lines (our polls while nothing listened) may come before or after the
    server's own message: they are left out; its other lines (a command it cannot run) are the reason and stay."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    def ended(stderr: str) -> str:
        done: Future = Future()
        done.set_result(SimpleNamespace(stderr=stderr, stdout="", rc=3, oom_killed=False))
        server = openenv_image.ImageServer.__new__(openenv_image.ImageServer)
        server._server = done
        return server._ended()

    poll = "forward_in_sandbox: cannot connect to 127.0.0.1:8000: [Errno 111] Connection refused\n"
    assert ended(poll + "cannot find the model weights\n" + poll) == "exit status 3: cannot find the model weights"
    assert ended("forward_in_sandbox: cannot run uvicorn: [Errno 2] No such file\n") == \
        "exit status 3: forward_in_sandbox: cannot run uvicorn: [Errno 2] No such file"
    assert ended(poll) == "exit status 3, no output"
