"""The viewer's web app: a small Starlette application over one run directory.

Routes (all GET, all read-only):

- ``/`` the page, ``/static/…`` its script and style (shipped in this package: the page needs no network);
- ``/api/run`` the run's name, env, algorithm and whether it has finished;
- ``/api/metrics`` the rows of ``metrics.jsonl``;
- ``/api/steps`` the steps with rollout records and a line about each;
- ``/api/steps/{step}`` a step's records, filtered by ``kind``, ``status``, ``tool``, ``reward_min``, ``reward_max``;
- ``/media/{path}`` a media file of the run (only under ``RUN_DIR/media``), with its content type, so ``<video>``,
  ``<audio>`` and ``<img>`` play it directly (Starlette's file response answers range requests, which browsers
  use to seek in a video).

Starlette and uvicorn because they are already here (Ray Serve depends on both), they serve files with ranges and
the right headers, and the app is a few functions that tests drive with Starlette's ``TestClient`` without a socket.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from relax_gym.viewer.run_files import RunFiles, filter_records, media_type

__all__ = ["STATIC_DIR", "make_app"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
_NO_STORE = {"Cache-Control": "no-store"}  # a run still going changes these answers


def _float(request: Request, name: str) -> float | None:
    value = request.query_params.get(name)
    if value in (None, ""):
        return None
    try:
        return float(value)
    except ValueError:
        raise HTTPException(400, f"{name} must be a number, got {value!r}") from None


def make_app(run_dir: str | Path) -> Starlette:
    """The app serving ``run_dir`` (which need not hold anything yet: a run that has just started)."""
    files = RunFiles(run_dir)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=_NO_STORE)

    async def run(request: Request) -> Response:
        return JSONResponse(files.describe(), headers=_NO_STORE)

    async def metrics(request: Request) -> Response:
        return JSONResponse(files.metrics(), headers=_NO_STORE)

    async def steps(request: Request) -> Response:
        return JSONResponse(files.steps(), headers=_NO_STORE)

    async def step(request: Request) -> Response:
        number = request.path_params["step"]
        if number not in files.step_numbers():
            raise HTTPException(404, f"no rollout records for step {number}")
        q = request.query_params
        records = filter_records(files.records(number), kind=q.get("kind") or None, status=q.get("status") or None,
                                 tool=q.get("tool") or None, reward_min=_float(request, "reward_min"),
                                 reward_max=_float(request, "reward_max"))
        return JSONResponse(records, headers=_NO_STORE)

    async def media(request: Request) -> Response:
        path = files.media_path(request.path_params["path"])
        if path is None:
            raise HTTPException(404, "no such media file in this run")
        return FileResponse(path, media_type=media_type(path))

    return Starlette(routes=[
        Route("/", index),
        Route("/api/run", run),
        Route("/api/metrics", metrics),
        Route("/api/steps", steps),
        Route("/api/steps/{step:int}", step),
        Route("/media/{path:path}", media),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ])
