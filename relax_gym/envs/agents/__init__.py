"""Agent programs the built-in agent-program envs run (plain scripts: they import nothing of relax_gym)."""
