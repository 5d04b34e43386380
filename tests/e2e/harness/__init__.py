"""End-to-end harness: our image, the chart's pods, the training operator's env, podman.

Modules, one job each:

- :mod:`.podman`     the podman CLI with the project's containers.conf
- :mod:`.wheels`     a local wheel index with what the Dockerfile installs
- :mod:`.image`      the base image (debootstrap) and the trainer image (our Dockerfile)
- :mod:`.chart`      the chart rendered by the real Helm
- :mod:`.operator`   the pods the training operator v1.9 would create (names, labels, env)
- :mod:`.kubelet`    those pods as podman 4.3 can play them (volumes, downward API)
- :mod:`.job`        a played PyTorchJob: start, supervise with the restart policy, kill,
                     drain, tear down
- :mod:`.prometheus` a real Prometheus scraping the pods as a PodMonitor would

docs/e2e.md says what is real and what stands in for Kubernetes.
"""
