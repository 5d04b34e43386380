"""The process group: bootstrap from the launcher's environment, what the ranks agree on
(resume point, stop, divergence, lost peers, timed checkpoints), preemption (SIGTERM), and each
rank's share of the pod's CPU (threads)."""
