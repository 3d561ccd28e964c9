"""``relax-gym view RUN_DIR``: a local web page over a run directory — curves from ``metrics.jsonl``, the steps with
rollout records, each rollout as a conversation with its video, audio and pictures, and two steps side by side.

It reads the run's files only and imports nothing of the trainer (tests/test_layout.py checks), so it works on a
run copied from another machine and while the run is still writing (the page polls). docs/viewer.md has the rest.
"""

from relax_gym.viewer.app import make_app
from relax_gym.viewer.serve import serve

__all__ = ["make_app", "serve"]
