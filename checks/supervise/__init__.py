"""Supervised process groups, shared by the collective checks and the acceptance jobs (trainer).

`launch.py` runs on the supervising side (torchrun in its own session, heartbeats watched, the
whole group killed on a hang, the rank that hung or crashed named); `rank.py` runs inside every
rank (heartbeats, results, errors, fault injection for the tests); `procs.py` finds and kills
whatever a launch left behind. It imports nothing else of the project, so the trainer uses it
without reaching into the check suite.
"""
