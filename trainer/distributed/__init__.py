"""The process group: bootstrap from the launcher's environment, what the ranks agree on
(resume point, stop, divergence, lost peers), and preemption (SIGTERM)."""
