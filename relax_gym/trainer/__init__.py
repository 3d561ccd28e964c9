"""The RL trainer: roles, data bus, staleness, algorithms, backends, engines, weight sync. Imports envs and omni.

Not built yet: the learning loop and the asynchronous engine arrive with their own issues.
"""
