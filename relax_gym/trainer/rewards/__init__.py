"""Rewards the trainer computes beside the env: the judge (LLM-as-judge, the GenRM role's core) that scores the
rubric parts an env leaves pending, and the judge model built in code for the bundled open-ended envs."""
