"""The node side: the check suite that runs on every GPU node (`python -m checks`).

Registry, context and runner; the checks themselves (`suite/`); the rules that judge measurements
(`rules`, `workload_plan`, `topology`); the time budget, recording a machine as a scenario. It reads
the machine only through the hardware layer (`checks.hw`), and never imports the controller side
(`checks.fleet`).
"""
