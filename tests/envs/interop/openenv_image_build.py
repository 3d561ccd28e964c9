"""An OpenEnv env's Docker image made the way OpenEnv makes one, without a registry.

``openenv init NAME`` (OpenEnv's own CLI, in the OpenEnv venv) writes the env's published layout: ``models.py``,
``server/NAME_environment.py``, ``server/app.py`` (``create_app``), ``openenv.yaml``, ``server/Dockerfile``. The
env's logic here is the example of OpenEnv's docs (tests/envs/interop/openenv_example.py: say a secret word back),
written into that layout. The image is the runtime stage of the generated Dockerfile, built by the Docker engine:
its ``WORKDIR``, ``ENV PATH``/``PYTHONPATH`` and ``CMD`` lines as generated (uvicorn on port 8000), ``/app/.venv``
and ``/app/env`` where its ``COPY`` lines put them. Two things stand in for what needs a network: the base image
(``ghcr.io/meta-pytorch/openenv-base``, a python:3.11 image) is relax-gym's sandbox base (the host's Debian
python3.11 + busybox) with the shared libraries compiled wheels need from a Debian base (libgcc, libstdc++, zlib,
glibc's stubs), and ``/app/.venv`` holds openenv-core's dependency closure copied from the OpenEnv venv instead of ``uv sync``.

The tag carries a key of this file and of the OpenEnv venv, so a machine builds it once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from relax_gym.sandbox.spec import DEFAULT_IMAGE

from .openenv_example import ENVIRONMENT, IMPORT_MODELS, MODELS

ENV_NAME = "secret_word"

CLOSURE = '''
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
seen, todo, files = set(), [(name, "") for name in sys.argv[1:]], []
while todo:
    name, extra = todo.pop()
    name = canonicalize_name(name)
    if (name, extra) in seen:
        continue
    dist = md.distribution(name)
    if not any(n == name for n, _ in seen):
        files += [str(f) for f in dist.files or ()]
    seen.add((name, extra))
    for text in dist.requires or ():
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
dists = sorted({n for n, _ in seen})
print(json.dumps({"dists": dists, "files": sorted(files), "site": str(md.distribution("openenv-core").locate_file(""))}))
'''

UVICORN = "#!/app/.venv/bin/python\nimport sys\nfrom uvicorn.main import main\nsys.exit(main())\n"
# what a Debian python base has and relax-gym's sandbox base leaves out, which compiled wheels (pydantic_core, numpy,
# orjson, ...) link to
LIBS = ("libgcc_s.so.1", "libstdc++.so.6", "libz.so.1", "libmvec.so.1", "libpthread.so.0", "librt.so.1", "libdl.so.2",
        "libutil.so.1")
LIB_DIR = "/lib/x86_64-linux-gnu"
BASE = f"""FROM {DEFAULT_IMAGE} AS openenv-base
COPY libs/ /usr/lib/x86_64-linux-gnu/
"""


def runtime_stage(dockerfile: str) -> str:
    """The generated Dockerfile's last stage, its COPY lines taking what ``uv sync`` made from the context."""
    stage = dockerfile[dockerfile.rindex("\nFROM ") + 1:]
    stage = re.sub(r"^FROM .*$", "FROM openenv-base", stage, count=1, flags=re.M)
    stage = stage.replace("COPY --from=builder /app/env/.venv /app/.venv", "COPY venv /app/.venv")
    stage = stage.replace("COPY --from=builder /app/env /app/env", "COPY env /app/env")
    assert "--from=builder" not in stage, stage
    return BASE + stage


def generate_layout(openenv_bin: Path, where: Path) -> Path:
    """``openenv init`` in ``where``, then the docs' example env written into the files it made."""
    subprocess.run([str(openenv_bin), "init", ENV_NAME, "--output-dir", str(where)], check=True, capture_output=True,
                   text=True, timeout=300)
    env = where / ENV_NAME
    (env / "models.py").write_text(MODELS)
    (env / "server" / f"{ENV_NAME}_environment.py").write_text(IMPORT_MODELS + ENVIRONMENT)
    app = env / "server" / "app.py"  # the template serves one session at a time; a trainer wants several
    app.write_text(app.read_text().replace("max_concurrent_envs=1,", "max_concurrent_envs=16,"))
    for cache in env.rglob("__pycache__"):
        shutil.rmtree(cache)
    return env


def _stage_venv(python: Path, venv: Path) -> None:
    """openenv-core's dependency closure from the OpenEnv venv, laid out as a venv at /app/.venv."""
    closure = json.loads(subprocess.run([str(python), "-c", CLOSURE, "openenv-core"], check=True, capture_output=True,
                                        text=True, timeout=120).stdout)
    site = Path(closure["site"])
    target = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for name in closure["files"]:
        if name.startswith(".."):  # console scripts: the image gets the one it runs below
            continue
        src, dst = site / name, target / name
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(src, dst)
    (venv / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3.11", venv / "bin" / "python")
    os.symlink("python", venv / "bin" / "python3")
    (venv / "bin" / "uvicorn").write_text(UVICORN)
    (venv / "bin" / "uvicorn").chmod(0o755)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")


def build_openenv_image(python: Path) -> str:
    """The image's tag (``relax-gym-test/openenv-secret-word:<key>``), built unless the engine has it."""
    import docker

    client = docker.from_env(timeout=600)
    # what decides the image: this file (the env, the Dockerfile's changes, the libraries) and the OpenEnv venv
    # (named by its pins); known, the build is skipped without running anything
    key = hashlib.sha256(Path(__file__).read_bytes() + python.parent.parent.name.encode()).hexdigest()[:12]
    tag = f"relax-gym-test/openenv-{ENV_NAME.replace('_', '-')}:{key}"
    if client.images.list(name=tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="openenv-image-", dir=python.parent.parent.parent) as tmp:
        context = Path(tmp)
        env = generate_layout(python.parent / "openenv", context / "generated")
        _stage_venv(python, context / "venv")
        shutil.copytree(env, context / "env")
        (context / "Dockerfile").write_text(runtime_stage((env / "server" / "Dockerfile").read_text()))
        (context / "libs").mkdir()
        for lib in LIBS:
            shutil.copy2(Path(LIB_DIR) / lib, context / "libs" / lib)
        shutil.rmtree(context / "generated")
        client.images.build(path=str(context), tag=tag, rm=True, forcerm=True)
    return tag


if __name__ == "__main__":  # set-up, as .ci/run does it: `python -m tests.envs.interop.openenv_image_build`
    from relax_gym.envs.interop.frameworks import FRAMEWORKS
    from relax_gym.envs.interop.venvs import ensure_venv

    print(build_openenv_image(ensure_venv(FRAMEWORKS["openenv"])))
