"""Isolated execution for tool code (Docker, bubblewrap, warm pool). Imports nothing else of relax_gym.

Not built yet: the backends arrive with the sandbox issue; this package exists so the layout and the
direction of imports are fixed from the start (envs may import sandbox; sandbox imports nothing of ours).
"""
