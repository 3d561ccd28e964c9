"""Bringing up Ray for the trainer's parts that run on it (roles, rank groups, benches)."""
