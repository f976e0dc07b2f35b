"""Reference training jobs run as acceptance tests: single, localize, dp, ddp, pipeline, hybrid,
syncbn, fsdp, tp, bf16, compile, accum, loader, ckpt and throughput (trainer/jobs/, one module
each).

Each job trains a small deterministic model on a synthetic seeded dataset for k steps in its
parallel mode and the same k steps on one device, and compares (see docs/trainer.md).
Entry points: `python -m trainer` (trainer_cli.main), trainer.launcher.run_jobs (one launch, all jobs),
trainer.launcher.run_ddp_multinode (c10d rendezvous across hosts).
"""
