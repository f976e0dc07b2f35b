"""Multi-process launching shared by the collective checks and the acceptance jobs.

`launch.py` runs on the supervising side (torchrun in its own session, heartbeats watched, the
whole group killed on a hang); `rank.py` runs inside every rank (heartbeats, results, errors,
fault injection for the tests).
"""
