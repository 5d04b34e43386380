"""Job management for PyTorchJobs and TrainJobs: ``ddp-trainer jobs ...`` and ``kubectl ddp``.

Nothing here imports ``kubernetes`` at module level, so the trainer keeps working in images and
venvs installed without the ``k8s`` extra; the commands import it when they run.
"""
