"""The gateway's tests serve the engines' tiny policy: the same fixtures as tests/trainer/engines."""

from ..engines.conftest import policy, served  # noqa: F401 - fixtures
