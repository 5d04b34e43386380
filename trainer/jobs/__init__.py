"""Job management for PyTorchJobs: ``ddp-trainer jobs ...`` and the ``kubectl ddp`` plugin.

Nothing here imports ``kubernetes`` at module level, so the trainer keeps working in images and
venvs installed without the ``k8s`` extra; the commands import it when they run.
"""
